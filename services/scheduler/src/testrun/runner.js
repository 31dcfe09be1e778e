// The sandmesh test runner for JavaScript (services/scheduler/src/testrun/runner.js): runs
// `node --test` on the tests with the JUnit reporter beside it, which rewrites the report in the
// workspace after every test, and stops the tests before the execution's own deadline, so the
// tests that finished are reported even when one never ends.
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");

const CONFIG = __CONFIG__;
const report = path.resolve(CONFIG.report);
fs.mkdirSync(path.dirname(report), { recursive: true });
const child = spawn(
  process.execPath,
  [
    "--test",
    "--test-reporter=spec",
    "--test-reporter-destination=stdout",
    "--test-reporter=" + path.resolve(CONFIG.reporter),
    "--test-reporter-destination=stderr",
    CONFIG.tests,
  ],
  {
    cwd: CONFIG.dir,
    stdio: "inherit",
    env: { ...process.env, SANDMESH_TEST_REPORT: report },
  },
);
let timedOut = false;
const budget = setTimeout(() => {
  timedOut = true;
  child.kill("SIGINT");
  setTimeout(() => child.kill("SIGKILL"), CONFIG.grace_ms).unref();
}, CONFIG.budget_ms);
child.on("exit", (code) => {
  clearTimeout(budget);
  if (timedOut) {
    process.stderr.write("sandmesh: the tests ran out of time\n");
    process.exit(CONFIG.timeout_exit);
  }
  process.exit(code === null ? 1 : code);
});
