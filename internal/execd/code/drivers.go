package code

// Built-in REPL drivers for /code when no Jupyter server is configured.
// Each reads one JSON request per line ({"code": ...}) from fd 4 and writes
// JSON messages to fd 3: {"type":"stdout"|"stderr","text"},
// {"type":"result","data":{"text/plain":...}}, {"type":"error","ename",
// "evalue","traceback"} and finally {"type":"done"} per request. Output
// written straight to fds 1 and 2 (e.g. by subprocesses) is streamed too.

const pythonDriver = `
import ast, io, json, os, sys, traceback
_ctl = os.fdopen(3, "w", buffering=1)
def _send(m):
    _ctl.write(json.dumps(m) + "\n"); _ctl.flush()
class _W(io.TextIOBase):
    def __init__(self, name): self.name = name
    def write(self, s):
        if s: _send({"type": self.name, "text": s})
        return len(s)
    def writable(self): return True
sys.stdout, sys.stderr = _W("stdout"), _W("stderr")
_g = {"__name__": "__main__", "__builtins__": __builtins__}
_req = os.fdopen(4, "r")
while True:
    try:
        _line = _req.readline()
    except KeyboardInterrupt:
        continue
    if not _line:
        break
    try:
        _code = json.loads(_line)["code"]
        _tree = ast.parse(_code, "<cell>", "exec")
        _last = None
        if _tree.body and isinstance(_tree.body[-1], ast.Expr):
            _last = ast.Expression(_tree.body.pop().value)
        exec(compile(_tree, "<cell>", "exec"), _g)
        if _last is not None:
            _v = eval(compile(_last, "<cell>", "eval"), _g)
            if _v is not None:
                _send({"type": "result", "data": {"text/plain": repr(_v)}})
    except BaseException as _e:
        _send({"type": "error", "ename": type(_e).__name__, "evalue": str(_e),
               "traceback": traceback.format_exception(type(_e), _e, _e.__traceback__)})
    _send({"type": "done"})
`

const nodeDriver = `
const vm = require("vm"), fs = require("fs"), util = require("util"), readline = require("readline");
const send = (m) => fs.writeSync(3, JSON.stringify(m) + "\n");
const out = (name) => (...a) => send({type: name, text: util.format(...a) + "\n"});
const cons = {log: out("stdout"), info: out("stdout"), debug: out("stdout"), warn: out("stderr"), error: out("stderr")};
const ctx = vm.createContext({console: cons, require, process, Buffer, URL, TextEncoder, TextDecoder,
  setTimeout, setInterval, clearTimeout, clearInterval, setImmediate, queueMicrotask, module: {exports: {}}});
const rl = readline.createInterface({input: fs.createReadStream(null, {fd: 4})});
rl.on("line", (line) => {
  try {
    const v = vm.runInContext(JSON.parse(line).code, ctx, {filename: "<cell>", breakOnSigint: true});
    if (v !== undefined) send({type: "result", data: {"text/plain": util.inspect(v)}});
  } catch (e) {
    const name = (e && e.name) || "Error", msg = (e && e.message !== undefined) ? String(e.message) : String(e);
    send({type: "error", ename: name, evalue: msg, traceback: String((e && e.stack) || e).split("\n")});
  }
  send({type: "done"});
});
process.on("SIGINT", () => {});
`

// bashDriver sources each cell in one long-lived shell, so variables,
// functions and cwd persist. The request is the path of a cell file.
const bashDriver = `trap 'true' INT
while IFS= read -r __moat_line <&4; do
  __moat_f=${__moat_line#*\"code\":\"}; __moat_f=${__moat_f%\"*}
  . "$__moat_f"
  printf '{"type":"done"}\n' >&3
done
`
