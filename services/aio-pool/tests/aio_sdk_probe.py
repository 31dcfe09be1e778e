# Drives an AIO instance with the official `agent-sandbox` SDK (run by tests/sdk.rs from its
# cached venv; AIO_URL and AIO_KEY name the instance). Every call below is one the SDK makes
# against upstream's image; an assertion failure exits non-zero with the reason.
import json
import os

from agent_sandbox import Sandbox

client = Sandbox(base_url=os.environ["AIO_URL"], headers={"X-AIO-API-Key": os.environ["AIO_KEY"]})
seen = {}

# Jupyter: state kept between calls of one session, not seen by another.
first = client.jupyter.execute_code(code="x = 41\nprint('set')", session_id="sdk")
assert first.success and first.data.status == "ok", first
second = client.jupyter.execute_code(code="x + 1", session_id="sdk")
results = [o for o in second.data.outputs if o.output_type == "execute_result"]
assert results and results[0].data["text/plain"] == "42", second
other = client.jupyter.execute_code(code="x", session_id="sdk-other")
assert other.data.status == "error", other
seen["jupyter"] = results[0].data["text/plain"]
created = client.jupyter.create_session(session_id="sdk-made")
assert created.data.session_id == "sdk-made", created

# Files: write, replace, search, find, the editor.
home = "/home/gem"
client.file.write_file(file=f"{home}/pkg/mod.py", content="a = 1\nb = a\na = 2\n")
replaced = client.file.replace_in_file(file=f"{home}/pkg/mod.py", old_str="a =", new_str="z =")
assert replaced.success and replaced.data.replaced_count == 2, replaced
found = client.file.search_in_file(file=f"{home}/pkg/mod.py", regex=r"^z = \d")
assert found.data.line_numbers == [0, 2] and found.data.matches == ["z = 1", "z = 2"], found
files = client.file.find_files(path=home, glob="**/*.py")
assert files.data.files == [f"{home}/pkg/mod.py"], files
edited = client.file.str_replace_editor(command="str_replace", path=f"{home}/pkg/mod.py",
                                        old_str="b = a", new_str="b = 3")
assert edited.success and "b = 3" in edited.data.new_content, edited
refused = client.file.str_replace_editor(command="view", path="/etc/passwd")
assert not refused.success and refused.data.error, refused
seen["files"] = files.data.files

# Code and Node.js.
code = client.code.execute_code(language="python", code="print(6 * 7)")
assert code.data.stdout == "42\n", code
node = client.nodejs.execute_code(code="console.log(6 * 7)")
assert node.data.stdout == "42\n" and node.data.exit_code == 0, node
seen["code"] = code.data.stdout.strip()

# Shell in an absolute directory outside the workspace.
shell = client.shell.exec_command(command="pwd", exec_dir="/tmp")
assert shell.data.output.strip() == "/tmp", shell

print(json.dumps(seen))
