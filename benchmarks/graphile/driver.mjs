// Graphile Worker's side of the benchmark, run by benchmarks/bench_graphile.py:
//
//   node driver.mjs migrate DSN                 install Graphile Worker's schema
//   node driver.mjs latency-worker DSN OUT N    print READY, then record when each of N
//                                               `stamp` jobs starts (epoch seconds, by its
//                                               `seq`) into OUT and exit
//   node driver.mjs drain DSN                   run no-op jobs until none is left (runOnce)
//
// Settings: the drain takes those of Graphile Worker's performance page (24 concurrent
// jobs, a pool of 25, a local queue of 500, completions and failures batched with no
// delay); the latency worker takes 24 concurrent jobs and a pool of 25 with the rest at
// Graphile's defaults, so that each job is fetched when its notification arrives.
import { writeFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { Logger, run, runMigrations, runOnce } from "graphile-worker";

const [mode, dsn, out, n] = process.argv.slice(2);

// Graphile logs each job at INFO; the measurement keeps none of it.
const logger = new Logger(() => () => {});

const BEST = {
  concurrentJobs: 24,
  maxPoolSize: 25,
  localQueue: { size: 500 },
  completeJobBatchDelay: 0,
  failJobBatchDelay: 0,
};

function epochSeconds() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

if (mode === "migrate") {
  await runMigrations({ connectionString: dsn, logger });
} else if (mode === "drain") {
  await runOnce({
    logger,
    noHandleSignals: true,
    preset: { worker: { connectionString: dsn, ...BEST } },
    taskList: { noop: async () => {} },
  });
} else if (mode === "latency-worker") {
  const expected = Number(n);
  const started = {};
  let count = 0;
  let runner;
  const done = new Promise((resolve) => {
    runner = run({
      logger,
      noHandleSignals: true,
      preset: { worker: { connectionString: dsn, concurrentJobs: 24, maxPoolSize: 25 } },
      taskList: {
        stamp: async (payload) => {
          started[payload.seq] = epochSeconds();
          count += 1;
          if (count >= expected) resolve();
        },
      },
    });
  });
  const r = await runner;
  process.stdout.write("READY\n");
  await done;
  await r.stop();
  writeFileSync(out, JSON.stringify(started));
} else {
  process.stderr.write(`unknown mode ${mode}\n`);
  process.exit(2);
}
