// The test reporter of sandmesh test runs (services/scheduler/src/testrun/records.mjs), for
// `node --test`: sends each finished test case (announced as collected, then its outcome) and
// a closing record (how many cases, the exit code `node --test` owes them) to the runner's
// parent process over the pipe named by $SANDMESH_TEST_RECORDS, one JSON object a line. The
// parent checks them and writes the report; nothing here is trusted beyond that.
import { writeSync } from "node:fs";
import { basename, extname } from "node:path";

const pipe = Number(process.env.SANDMESH_TEST_RECORDS);
const MESSAGE_BYTES = 4096;

const send = (record) => {
  const data = Buffer.from(JSON.stringify(record) + "\n");
  for (let at = 0; at < data.length; ) at += writeSync(pipe, data, at);
};

function message(error) {
  if (!error) return "";
  const cause = error.cause ?? error;
  return String(cause?.message ?? cause).slice(0, MESSAGE_BYTES);
}

// A test's verdict: its own code failed, or something around it (a hook, a timeout, a
// cancellation) broke.
function verdict(data) {
  if (data.skip !== undefined && data.skip !== false) return ["skipped", data.skip];
  if (data.todo !== undefined && data.todo !== false) return ["skipped", data.todo];
  const error = data.details?.error;
  if (!error) return ["passed", ""];
  return [error.failureType === "testCodeFailure" ? "failed" : "error", message(error)];
}

export default async function* records(source) {
  // Per nesting level: the names of the tests running, and whether the one at that level had
  // subtests (then it is a suite or a file, not a test case of its own).
  const names = [];
  const hadChildren = [];
  // Node lets two tests share a name: the second of a name is `name #2`.
  const seen = new Map();
  let cases = 0;
  let failed = false;
  for await (const event of source) {
    const data = event.data ?? {};
    const nesting = data.nesting ?? 0;
    if (event.type === "test:start") {
      names[nesting] = data.name;
      hadChildren[nesting] = false;
      if (nesting > 0) hadChildren[nesting - 1] = true;
      continue;
    }
    if (event.type !== "test:pass" && event.type !== "test:fail") continue;
    // A failing todo test fails nothing (node exits 0 for it).
    if (event.type === "test:fail" && (data.todo === undefined || data.todo === false)) {
      failed = true;
    }
    if (nesting > 0) hadChildren[nesting - 1] = true;
    const parent = hadChildren[nesting];
    hadChildren[nesting] = false;
    const failureType = data.details?.error?.failureType;
    // A suite or file is reported through its tests, unless it broke on its own.
    if (parent && (event.type === "test:pass" || failureType === "subtestsFailed")) continue;
    if (data.details?.type === "suite" && event.type === "test:pass") continue;
    const file = data.file ? basename(data.file, extname(data.file)) : "";
    const classname = names.slice(0, nesting).filter(Boolean).join(" > ") || file;
    const path = `${classname} > ${data.name}`;
    const nth = (seen.get(path) ?? 0) + 1;
    seen.set(path, nth);
    const id = nth === 1 ? path : `${path} #${nth}`;
    const [status, why] = verdict(data);
    cases += 1;
    send({ kind: "collected", id });
    send({
      kind: "test",
      id,
      name: data.name,
      classname,
      status,
      message: status === "passed" ? undefined : String(why ?? ""),
      duration_ms: Math.round(data.details?.duration_ms ?? 0),
    });
  }
  send({ kind: "closing", collected: cases, exit: failed ? 1 : 0 });
}
