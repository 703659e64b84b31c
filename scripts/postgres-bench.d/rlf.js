// rate-limiter-flexible's RateLimiterPostgres under load: the contender
// scripts/postgres-bench runs beside Sluice's PostgresStore. CALLERS
// consume() calls in flight at once over a pg Pool of POOL connections,
// each caller calling again as soon as its call settles, on keys drawn
// uniformly from KEYS (1 is one hot key). Calls that settle within the
// measured window count: resolved is allowed, rejected with a
// RateLimiterRes is denied, rejected with an Error failed. Prints one JSON
// line, the same fields as crates/sluice-postgres/examples/pg_load.rs,
// with the CPU of the server's processes (utime + stime of --server-pid
// and its children, ended ones included, from /proc) and of this process over the window, in
// clock ticks.
//
//   NODE_PATH=DIR/node_modules node rlf.js --url postgres://... --server-pid PID
//       [--keys 10000] [--callers 32] [--pool 16] [--points 2] [--duration 10]
//       [--table NAME] [--warmup 1] [--secs 5]
'use strict';

const fs = require('fs');
const { Pool } = require('pg');
const { RateLimiterPostgres, RateLimiterRes } = require('rate-limiter-flexible');

function options(argv) {
  const o = {
    url: null, serverPid: null, keys: 10000, callers: 32, pool: 16,
    points: 2, duration: 10, table: 'rlf_bench', warmup: 1, secs: 5,
  };
  for (let i = 2; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(name in o) || i + 1 >= argv.length) throw new Error(`unknown or empty option ${argv[i]}`);
    o[name] = ['url', 'table'].includes(name) ? argv[i + 1] : Number(argv[i + 1]);
  }
  if (!o.url || !o.serverPid) throw new Error('--url and --server-pid are required');
  return o;
}

// From a stat line: the parent's pid, the process's own utime + stime, and
// the cutime + cstime of its children that have ended, in clock ticks.
function statTicks(line) {
  const f = line.slice(line.lastIndexOf(')') + 1).trim().split(/\s+/);
  return { ppid: Number(f[1]), ticks: Number(f[11]) + Number(f[12]), reaped: Number(f[13]) + Number(f[14]) };
}

// The CPU of `root` and of its children, running or ended (and reaped by
// it): the postmaster, its backends and helpers.
function treeTicks(root) {
  const own = statTicks(fs.readFileSync(`/proc/${root}/stat`, 'utf8'));
  let total = own.ticks + own.reaped;
  for (const pid of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    let line;
    try {
      line = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    } catch {
      continue; // ended since the listing
    }
    const s = statTicks(line);
    if (s.ppid === root) total += s.ticks;
  }
  return total;
}

const ownTicks = () => statTicks(fs.readFileSync('/proc/self/stat', 'utf8')).ticks;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const o = options(process.argv);
  const pool = new Pool({ connectionString: o.url, max: o.pool });
  const limiter = await new Promise((resolve, reject) => {
    const l = new RateLimiterPostgres(
      { storeClient: pool, storeType: 'pool', tableName: o.table, points: o.points, duration: o.duration },
      (err) => (err ? reject(err) : resolve(l)),
    );
  });
  const keys = Array.from({ length: o.keys }, (_, i) => `user:${String(i).padStart(8, '0')}`);
  const c = { allowed: 0, denied: 0, errors: 0, firstError: null };
  let measuring = false;
  let stop = false;
  async function caller() {
    while (!stop) {
      const key = keys[Math.floor(Math.random() * keys.length)];
      let outcome;
      try {
        await limiter.consume(key, 1);
        outcome = 'allowed';
      } catch (e) {
        if (e instanceof RateLimiterRes) {
          outcome = 'denied';
        } else {
          outcome = 'errors';
          if (measuring && c.firstError === null) c.firstError = String(e && e.message ? e.message : e);
        }
      }
      if (measuring) c[outcome] += 1;
    }
  }
  const callers = Array.from({ length: o.callers }, caller);
  await sleep(o.warmup * 1000);
  const server0 = treeTicks(o.serverPid);
  const client0 = ownTicks();
  const started = process.hrtime.bigint();
  measuring = true;
  await sleep(o.secs * 1000);
  measuring = false;
  const secs = Number(process.hrtime.bigint() - started) / 1e9;
  const server1 = treeTicks(o.serverPid);
  const client1 = ownTicks();
  stop = true;
  await Promise.all(callers);
  await pool.end();
  console.log(JSON.stringify({
    allowed: c.allowed, denied: c.denied, errors: c.errors, first_error: c.firstError,
    secs, server_ticks: server1 - server0, client_ticks: client1 - client0,
    pool: o.pool, callers: o.callers,
  }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
