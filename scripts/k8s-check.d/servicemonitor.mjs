// Validates ServiceMonitors against the schema the Prometheus Operator's
// Go types publish (types, formats, required fields), as packaged by
// @kubernetes-models. Reads a JSON list of [name, object] pairs from the
// file named first; prints one JSON line per object, {name, ok, why}, and
// exits 1 if any failed.
import { readFileSync } from "node:fs";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";

let failed = false;
for (const [name, object] of JSON.parse(readFileSync(process.argv[2], "utf8"))) {
  try {
    new ServiceMonitor(object).validate();
    console.log(JSON.stringify({ name, ok: true }));
  } catch (e) {
    failed = true;
    console.log(JSON.stringify({ name, ok: false, why: e.message }));
  }
}
process.exit(failed ? 1 : 0);
