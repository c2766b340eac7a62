package code

import (
	"os"
	"path/filepath"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// Built-in drivers run code when the image has no Jupyter kernel for the
// language: one interpreter per context, cells in on fd 4 (a JSON line or,
// with cellFile, a cell file path), JSON messages out on fd 3 ("ready",
// then per cell "start", stdout/stderr/result/error, "done"). SIGINT is
// ignored between cells, so the agent sends it only after "start".

// driver is a built-in interpreter for one language.
type driver struct {
	language string
	argv     []string // the interpreter, with the driver program
	cellFile bool     // requests are cell file paths, not JSON
	ext      string   // cell file extension
	// cellPrefix is written before the code in a cell file.
	cellPrefix string
	// source is written to the context's directory and passed as the
	// last argument (drivers too large for -c/-e, or compiled ones).
	source     string
	sourceName string
}

// findDriver returns the built-in driver for language (a languageKey), nil
// if there is none, or an error naming the runtime the image lacks.
func findDriver(language string, env []string, shell string) (*driver, error) {
	missing := func(what string) error {
		return errdefs.WithPublic(errdefs.ErrFailedPrecondition, wire.CodeRuntimeError,
			"language runtime not available: "+what+" is not installed in this image")
	}
	look := func(names ...string) string {
		for _, n := range names {
			if p, err := proc.LookPath(n, env); err == nil {
				return p
			}
		}
		return ""
	}
	switch language {
	case "python":
		py := look("python3", "python")
		if py == "" {
			return nil, missing("python3")
		}
		return &driver{language: language, argv: []string{py, "-u", "-c", pythonDriver}}, nil
	case "javascript", "typescript":
		node := look("node", "nodejs")
		if node == "" {
			return nil, missing("node")
		}
		return &driver{language: language, argv: []string{node, "-e", nodeDriver, "--", language}}, nil
	case "bash":
		return &driver{language: language, argv: []string{shell, "-c", bashDriver}, cellFile: true, ext: ".sh", cellPrefix: bashCellPrefix}, nil
	case "java":
		// jshell marks a JDK (a JRE has neither jdk.jshell nor the
		// compiler the source launcher needs); java is its sibling.
		jshell := look("jshell")
		if jshell == "" {
			return nil, missing("a JDK (jshell)")
		}
		java := filepath.Join(filepath.Dir(jshell), "java")
		if real, err := filepath.EvalSymlinks(jshell); err == nil {
			java = filepath.Join(filepath.Dir(real), "java")
		}
		if _, err := os.Stat(java); err != nil {
			return nil, missing("java (next to jshell)")
		}
		return &driver{
			language: language, cellFile: true, ext: ".jsh",
			// Serial GC and a small heap keep an idle context cheap; the
			// source launcher compiles the driver at start.
			argv:   []string{java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss8m"},
			source: javaDriver, sourceName: "MoatJShell.java",
		}, nil
	}
	return nil, nil
}

const pythonDriver = `
import ast, io, json, os, signal, sys, traceback
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
_running = False
def _on_int(sig, frame):
    if _running:
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, _on_int)
_g = {"__name__": "__main__", "__builtins__": __builtins__}
_req = os.fdopen(4, "r")
_send({"type": "ready"})
while True:
    _line = _req.readline()
    if not _line:
        break
    try:
        _code = json.loads(_line)["code"]
        _tree = ast.parse(_code, "<cell>", "exec")
        _last = None
        if _tree.body and isinstance(_tree.body[-1], ast.Expr):
            _last = ast.Expression(_tree.body.pop().value)
        _running = True
        _send({"type": "start"})
        exec(compile(_tree, "<cell>", "exec"), _g)
        if _last is not None:
            _v = eval(compile(_last, "<cell>", "eval"), _g)
            if _v is not None:
                _send({"type": "result", "data": {"text/plain": repr(_v)}})
        _running = False
    except BaseException as _e:
        _running = False
        _send({"type": "error", "ename": type(_e).__name__, "evalue": str(_e),
               "traceback": traceback.format_exception(type(_e), _e, _e.__traceback__)})
    _send({"type": "done"})
`

// nodeDriver runs JavaScript, or TypeScript (argv "typescript") after
// compiling each cell to JavaScript with the typescript package (the
// image's, e.g. Debian's node-typescript) or, without it, Node's own type
// stripping (Node >= 22.13).
const nodeDriver = `
const vm = require("vm"), fs = require("fs"), util = require("util"), readline = require("readline"), path = require("path");
const send = (m) => fs.writeSync(3, JSON.stringify(m) + "\n");
const lang = process.argv[process.argv.length - 1];
let compile = (code) => code;
if (lang === "typescript") {
  let ts;
  try { ts = require(require.resolve("typescript", {paths: [process.cwd()]})); } catch (e) {}
  for (const dir of [...(process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean),
    "/usr/local/lib/node_modules", "/usr/lib/node_modules", "/usr/share/nodejs", "/usr/lib/nodejs"]) {
    if (ts) break;
    try { ts = require(path.join(dir, "typescript")); } catch (e) {}
  }
  if (ts) {
    const opts = {target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.CommonJS, esModuleInterop: true, alwaysStrict: false};
    compile = (code) => {
      const out = ts.transpileModule(code, {compilerOptions: opts, reportDiagnostics: true});
      const diags = (out.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error);
      if (diags.length) {
        const e = new SyntaxError(diags.map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n")).join("\n"));
        e.name = "TSError";
        throw e;
      }
      return out.outputText;
    };
  } else {
    let strip;
    try { strip = require("module").stripTypeScriptTypes; } catch (e) {}
    if (!strip) {
      send({type: "error", ename: "RuntimeError", evalue: "TypeScript needs the typescript package or Node >= 22.13 (node " + process.version + ")", traceback: []});
      process.exit(1);
    }
    compile = (code) => strip(code, {mode: "transform"});
  }
}
const out = (name) => (...a) => send({type: name, text: util.format(...a) + "\n"});
const cons = {log: out("stdout"), info: out("stdout"), debug: out("stdout"), warn: out("stderr"), error: out("stderr")};
const ctx = vm.createContext({console: cons, require, process, Buffer, URL, TextEncoder, TextDecoder,
  setTimeout, setInterval, clearTimeout, clearInterval, setImmediate, queueMicrotask, module: {exports: {}}, exports: {}});
// The cell reports "start" from inside the script, once breakOnSigint's
// watchdog is armed: a SIGINT before it would reach the no-op handler.
Object.defineProperty(ctx, "__moat_start", {value: () => { send({type: "start"}); }, enumerable: false});
const rl = readline.createInterface({input: fs.createReadStream(null, {fd: 4})});
rl.on("line", (line) => {
  try {
    const js = "__moat_start();" + compile(JSON.parse(line).code);
    const v = vm.runInContext(js, ctx, {filename: "<cell>", breakOnSigint: true});
    if (v !== undefined) send({type: "result", data: {"text/plain": util.inspect(v)}});
  } catch (e) {
    const name = (e && e.name) || "Error", msg = (e && e.message !== undefined) ? String(e.message) : String(e);
    send({type: "error", ename: name, evalue: msg, traceback: String((e && e.stack) || e).split("\n")});
  }
  send({type: "done"});
});
process.on("SIGINT", () => {});
send({type: "ready"});
`

// bashDriver sources each cell in one long-lived shell, so variables,
// functions and cwd persist. The request is the path of a cell file whose
// first line (cellPrefix) reports "start" from inside the sourced file, so
// the INT trap's return ends exactly that cell. A signal that interrupts
// read between cells is ignored.
const bashDriver = `trap 'if [ -n "$__moat_in" ]; then __moat_in=; return 130; fi' INT
printf '{"type":"ready"}\n' >&3
while :; do
  IFS= read -r __moat_f <&4
  __moat_rc=$?
  [ $__moat_rc -gt 128 ] && continue
  [ $__moat_rc -ne 0 ] && break
  __moat_in=1
  . "$__moat_f"
  if [ -z "$__moat_in" ]; then
    printf '{"type":"error","ename":"KeyboardInterrupt","evalue":"interrupted","traceback":[]}\n' >&3
  fi
  __moat_in=
  printf '{"type":"done"}\n' >&3
done
`

const bashCellPrefix = `printf '{"type":"start"}\n' >&3
`

// javaDriver evaluates cells with the JDK's JShell API in the driver's own
// JVM (local execution engine): snippets keep their state, the value of a
// final expression is the result, a compile error or an exception is the
// error. SIGINT stops the running cell (JShell.stop). The request is the
// path of a cell file.
const javaDriver = `
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import jdk.jshell.*;

public class MoatJShell {
    static PrintStream ctl;
    static volatile boolean running, stopping;

    static synchronized void send(String json) {
        ctl.print(json);
        ctl.print('\n');
        ctl.flush();
    }

    static String q(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c)); else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static void error(String name, String value, List<String> tb) {
        StringBuilder b = new StringBuilder("[");
        for (int i = 0; i < tb.size(); i++) {
            if (i > 0) b.append(',');
            b.append(q(tb.get(i)));
        }
        send("{\"type\":\"error\",\"ename\":" + q(name) + ",\"evalue\":" + q(value) + ",\"traceback\":" + b.append(']') + "}");
    }

    // Events turns writes into stdout/stderr messages, one per flush.
    static class Events extends OutputStream {
        final String type;
        final ByteArrayOutputStream buf = new ByteArrayOutputStream();
        Events(String type) { this.type = type; }
        public synchronized void write(int b) { buf.write(b); if (b == '\n') flush(); }
        public synchronized void write(byte[] b, int off, int len) { buf.write(b, off, len); }
        public synchronized void flush() {
            if (buf.size() == 0) return;
            String s = new String(buf.toByteArray(), StandardCharsets.UTF_8);
            buf.reset();
            send("{\"type\":\"" + type + "\",\"text\":" + q(s) + "}");
        }
    }

    public static void main(String[] args) throws Exception {
        ctl = new PrintStream(new FileOutputStream("/dev/fd/3"), true, "UTF-8");
        BufferedReader req = new BufferedReader(new InputStreamReader(new FileInputStream("/dev/fd/4"), StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new Events("stdout"), true, "UTF-8");
        PrintStream err = new PrintStream(new Events("stderr"), true, "UTF-8");
        System.setOut(out);
        System.setErr(err);
        JShell sh = JShell.builder().executionEngine("local").out(out).err(err)
            .in(new ByteArrayInputStream(new byte[0])).build();
        SourceCodeAnalysis sca = sh.sourceCodeAnalysis();
        // JShell.stop only acts once the snippet's code runs (not while it
        // compiles), so an interrupt is repeated until the cell ends.
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), s -> { if (running) stopping = true; });
        Thread stopper = new Thread(() -> {
            for (;;) {
                if (running && stopping) sh.stop();
                try { Thread.sleep(20); } catch (InterruptedException e) { return; }
            }
        }, "moat-stop");
        stopper.setDaemon(true);
        stopper.start();
        send("{\"type\":\"ready\"}");
        String line;
        while ((line = req.readLine()) != null) {
            String src = new String(Files.readAllBytes(Paths.get(line)), StandardCharsets.UTF_8);
            running = true;
            send("{\"type\":\"start\"}");
            try {
                run(sh, sca, src);
            } catch (Throwable t) {
                error(t.getClass().getSimpleName(), String.valueOf(t.getMessage()), List.of(t.toString()));
            } finally {
                running = false;
                stopping = false;
                out.flush();
                err.flush();
            }
            send("{\"type\":\"done\"}");
        }
    }

    static void run(JShell sh, SourceCodeAnalysis sca, String src) {
        String rest = src;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            String snippet = ci.source();
            if (ci.completeness() == SourceCodeAnalysis.Completeness.EMPTY) return;
            if (snippet == null || !ci.completeness().isComplete()) {
                error("CompilationException", "incomplete input: " + rest.strip(), List.of(rest.strip()));
                return;
            }
            rest = ci.remaining();
            boolean last = rest.isBlank();
            List<SnippetEvent> evs = sh.eval(snippet);
            if (stopping) {
                // A stopped snippet ends without an exception.
                error("InterruptedException", "interrupted", List.of("java.lang.InterruptedException: interrupted"));
                return;
            }
            for (SnippetEvent ev : evs) {
                if (ev.causeSnippet() != null) continue;
                if (ev.exception() != null) {
                    // IJava's shape, which clients branch on: ename is the
                    // JShell wrapper (EvalException), evalue and the first
                    // traceback line name the thrown class and its message.
                    Exception ex = ev.exception();
                    String cls = ex instanceof EvalException ? ((EvalException) ex).getExceptionClassName() : ex.getClass().getName();
                    String value = ex.getMessage() == null ? cls : cls + ": " + ex.getMessage();
                    List<String> tb = new ArrayList<>();
                    tb.add(value);
                    for (StackTraceElement el : ex.getStackTrace()) tb.add("\tat " + el);
                    error(ex.getClass().getSimpleName(), value, tb);
                    return;
                }
                if (ev.status() == Snippet.Status.REJECTED) {
                    List<String> msgs = new ArrayList<>();
                    sh.diagnostics(ev.snippet()).forEach(d -> msgs.add(d.getMessage(Locale.ROOT)));
                    if (msgs.isEmpty()) msgs.add("rejected: " + snippet.strip());
                    error("CompilationException", String.join("\n", msgs), msgs);
                    return;
                }
                Snippet sn = ev.snippet();
                boolean expr = sn.kind() == Snippet.Kind.EXPRESSION ||
                    (sn.kind() == Snippet.Kind.VAR && sn.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND);
                if (last && expr && ev.value() != null) {
                    send("{\"type\":\"result\",\"data\":{\"text/plain\":" + q(ev.value()) + "}}");
                }
            }
        }
    }
}
`
