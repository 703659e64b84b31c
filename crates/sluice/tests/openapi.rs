//! `GET /openapi.json`: the binary's HTTP port and the proxy's admin port
//! describe themselves, each path their routers answer is described, and
//! each described operation answers, on a real port, with a status its
//! description gives. `scripts/openapi-check` then holds the answers to the
//! description with schemathesis.

#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use support::{Process, eventually, free_port, serve_args, spawn_sluice};

/// The policy the README's commands use.
fn example_policy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/policy.yaml")
}

/// Waits until `url` answers 200.
async fn until_ready(client: &reqwest::Client, url: &str) {
    eventually(Duration::from_secs(10), url, async || {
        let r = client.get(url).send().await;
        r.is_ok_and(|r| r.status() == 200)
    })
    .await;
}

/// Starts `sluice serve` with the example policy; returns it and its base URL.
async fn start_serve(client: &reqwest::Client) -> (Process, String) {
    let (mut args, http, _) = serve_args(&example_policy());
    args.extend(["--admin-token".into(), "s3cret".into()]);
    let server = spawn_sluice(args);
    let base = format!("http://{http}");
    until_ready(client, &format!("{base}/readyz")).await;
    (server, base)
}

/// Starts `sluice proxy` with an admin port; returns it and the admin
/// port's base URL. No upstream is needed to answer the admin port.
async fn start_proxy_admin(client: &reqwest::Client) -> (Process, String) {
    let at = || format!("127.0.0.1:{}", free_port());
    let (upstream, listen, admin) = (at(), at(), at());
    let proxy = spawn_sluice([
        "proxy".into(),
        "--policy".into(),
        example_policy().into_os_string(),
        "--upstream".into(),
        format!("http://{upstream}").into(),
        "--listen".into(),
        listen.into(),
        "--admin".into(),
        admin.clone().into(),
    ] as [std::ffi::OsString; 9]);
    let base = format!("http://{admin}");
    until_ready(client, &format!("{base}/readyz")).await;
    (proxy, base)
}

/// A GET of `url`, which must be answered.
async fn get(client: &reqwest::Client, url: &str) -> reqwest::Response {
    client.get(url).send().await.unwrap()
}

/// Fetches `base`'s description and checks what every description must be:
/// JSON served as JSON, OpenAPI 3.1, this build's version, and every
/// `$ref` pointing at something in the document.
async fn description(client: &reqwest::Client, base: &str) -> Value {
    let res = get(client, &format!("{base}/openapi.json")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/json");
    let doc: Value = res.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let mut refs = Vec::new();
    visit(&doc, &mut |key, value| {
        if key == "$ref" {
            refs.push(value.as_str().unwrap().to_owned());
        }
    });
    assert!(!refs.is_empty());
    for r in refs {
        let target = r.strip_prefix('#').and_then(|p| doc.pointer(p));
        assert!(target.is_some(), "{r} points at nothing");
    }
    doc
}

/// Calls `f` with every key and value of every object in `v`, however deep.
fn visit(v: &Value, f: &mut impl FnMut(&str, &Value)) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                f(key, value);
                visit(value, f);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| visit(item, f)),
        _ => {}
    }
}

/// Checks that `doc` describes exactly the paths `routed`, that each
/// described operation answers a plain request with a status it describes
/// (never a 404 or a 405, which would mean no such route), and that a path
/// it does not describe is a 404.
async fn describes_exactly(client: &reqwest::Client, base: &str, doc: &Value, routed: &[&str]) {
    let paths = doc["paths"].as_object().unwrap();
    let described: BTreeSet<&str> = paths.keys().map(String::as_str).collect();
    let routed: BTreeSet<&str> = routed.iter().copied().collect();
    assert_eq!(described, routed, "described paths, then routed ones");
    for (path, item) in paths {
        let operations = item.as_object().unwrap();
        assert!(!operations.is_empty(), "{path} describes no operation");
        for (method, operation) in operations {
            let method: reqwest::Method = method.to_uppercase().parse().unwrap();
            let mut req = client.request(method.clone(), format!("{base}{path}"));
            if method == reqwest::Method::POST {
                req = req.body("{}");
            }
            let status = req.send().await.unwrap().status();
            assert!(
                ![404, 405].contains(&status.as_u16()),
                "{method} {path}: {status}"
            );
            assert!(
                operation["responses"].get(status.as_str()).is_some(),
                "{method} {path}: {status} is not described"
            );
        }
    }
    let undescribed = get(client, &format!("{base}/v1/undescribed")).await;
    assert_eq!(undescribed.status(), 404);
}

#[tokio::test]
async fn serve_describes_every_path_it_answers_and_its_bounds() {
    let client = reqwest::Client::new();
    let (_server, base) = start_serve(&client).await;
    let doc = description(&client, &base).await;
    describes_exactly(&client, &base, &doc, &sluice_server::serve::paths()).await;
    assert!(doc["paths"]["/v1/reset"]["post"]["security"][0]["adminToken"].is_array());
    assert!(doc["paths"]["/v1/refund"]["post"]["security"][0]["apiToken"].is_array());
    for token in ["adminToken", "apiToken"] {
        assert_eq!(
            doc["components"]["securitySchemes"][token]["scheme"],
            "bearer"
        );
    }
    // The bounds the server enforces are the ones described.
    let mut body_bounds = Vec::new();
    visit(&doc, &mut |key, value| {
        if key == "x-max-body-bytes" {
            body_bounds.push(value.as_u64().unwrap());
        }
    });
    assert_eq!(body_bounds, [sluice_server::serve::MAX_BODY as u64; 6]);
    let count = &doc["components"]["schemas"]["Call"]["properties"]["count"];
    assert_eq!(count["minimum"], 0);
    assert_eq!(count["maximum"], sluice_core::MAX_EXACT_TOKENS);
}

#[tokio::test]
async fn the_proxy_admin_port_describes_every_path_it_answers() {
    let client = reqwest::Client::new();
    let (_proxy, base) = start_proxy_admin(&client).await;
    let doc = description(&client, &base).await;
    assert_eq!(doc["info"]["title"], "Sluice proxy admin port");
    describes_exactly(&client, &base, &doc, &sluice_server::proxy::admin_paths()).await;
    // Each endpoint is described once: the admin port's are serve's.
    let serve: Value = serde_json::from_str(sluice_server::openapi::SERVE).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        assert_eq!(item, &serve["paths"][path], "{path}");
    }
}
