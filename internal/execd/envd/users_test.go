package envd_test

import (
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem"
	ppb "github.com/moat-sandbox/moat/internal/execd/envd/gen/process"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// usersHelperEnv names the home of the test user when the test binary
// runs TestUsersHelper in a mount namespace whose /etc/passwd and
// /etc/group have that user.
const usersHelperEnv = "MOAT_ENVD_USERS_HOME"

const testUID, testGID, extraGID = 4242, 4242, 4243

// TestUsers runs TestUsersHelper with a user database that has "user"
// (uid 4242, home in a temporary directory), bind-mounted in a private
// mount namespace so the host's stays untouched.
func TestUsers(t *testing.T) {
	testutil.RequiresRoot(t)
	tmp := t.TempDir()
	// The user must reach its home through the test's directories, up to
	// / ($TMPDIR may be a 0700 run directory): search permission for
	// others where it lacks, put back when the test ends.
	os.Chmod(tmp, 0o755)
	for d := filepath.Dir(tmp); d != "/"; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if mode := st.Mode().Perm(); mode&0o001 == 0 {
			os.Chmod(d, mode|0o001)
			t.Cleanup(func() { os.Chmod(d, mode) })
		}
	}
	home := filepath.Join(tmp, "home", "user")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(home, testUID, testGID)
	passwd, _ := os.ReadFile("/etc/passwd")
	group, _ := os.ReadFile("/etc/group")
	pp, gp := filepath.Join(tmp, "passwd"), filepath.Join(tmp, "group")
	os.WriteFile(pp, append(passwd, []byte("user:x:4242:4242::"+home+":/bin/bash\n")...), 0o644)
	os.WriteFile(gp, append(group, []byte("user:x:4242:\nextra:x:4243:user\n")...), 0o644)
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && exec "$3" -test.run '^TestUsersHelper$' -test.v -test.count=1`,
		"sh", pp, gp, os.Args[0])
	cmd.Env = append(os.Environ(), usersHelperEnv+"="+home)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestUsersHelper") {
		t.Fatalf("users helper: %v\n%s", err, out)
	}
}

func TestUsersHelper(t *testing.T) {
	home := os.Getenv(usersHelperEnv)
	if home == "" {
		t.Skip("run by TestUsers in its own mount namespace")
	}
	e := newEnv(t, envOpts{defaultUser: "user"})
	ctx := ctxT(t, 60*time.Second)

	// The default user's processes run as it, in its home, with its
	// supplementary groups and identity variables.
	r, err := e.run(ctx, &ppb.StartRequest{Process: bash(`echo "$(id -u) $(id -g) $(id -G) $HOME $USER $LOGNAME $(pwd)"`)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(r.stdout.String()), "4242 4242 4242 4243 "+home+" user user "+home; got != want {
		t.Fatalf("as user: %q, want %q", got, want)
	}
	// A request picks root by name.
	req := connect.NewRequest(&ppb.StartRequest{Process: bash(`id -u; echo $HOME`)})
	req.Header().Set("Authorization", basic("root"))
	s, err := e.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := collect[*ppb.StartResponse](s)
	if err != nil || rr.stdout.String() != "0\n/root\n" {
		t.Fatalf("as root: %q %v", rr.stdout.String(), err)
	}
	// A relative cwd is in the home.
	os.Mkdir(filepath.Join(home, "work"), 0o755)
	r, err = e.run(ctx, &ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "pwd", Cwd: ptr("work")}})
	if err != nil || r.stdout.String() != filepath.Join(home, "work")+"\n" {
		t.Fatalf("relative cwd: %q %v", r.stdout.String(), err)
	}

	owned := func(p string) {
		t.Helper()
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if sys := st.Sys().(*syscall.Stat_t); sys.Uid != testUID || sys.Gid != testGID {
			t.Fatalf("%s is owned by %d:%d", p, sys.Uid, sys.Gid)
		}
	}
	// Uploads to relative paths land in the home, with new parents, owned
	// by the user.
	up, _ := http.NewRequest("POST", e.filesURL(url.Values{"path": {"docs/hello.txt"}}), strings.NewReader("hi"))
	up.Header.Set("Content-Type", "application/octet-stream")
	resp, body := e.do(t, up)
	if resp.StatusCode != 200 || body != `[{"name":"hello.txt","path":"`+filepath.Join(home, "docs/hello.txt")+`","type":"file"}]`+"\n" {
		t.Fatalf("relative upload: %d %s", resp.StatusCode, body)
	}
	owned(filepath.Join(home, "docs"))
	owned(filepath.Join(home, "docs/hello.txt"))
	// ?username= picks the user of a /files request.
	resp, body = e.do(t, mustReq(t, "GET", e.filesURL(url.Values{"path": {"~/docs/hello.txt"}, "username": {"user"}})))
	if resp.StatusCode != 200 || body != "hi" {
		t.Fatalf("download ~/: %d %s", resp.StatusCode, body)
	}

	// RPC paths resolve the same way; MakeDir and Move chown what they create.
	md, err := e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "a/b"}))
	if err != nil || md.Msg.GetEntry().GetPath() != filepath.Join(home, "a/b") || md.Msg.GetEntry().GetOwner() != "user" || md.Msg.GetEntry().GetGroup() != "user" {
		t.Fatalf("makedir: %v %v", md, err)
	}
	owned(filepath.Join(home, "a"))
	if _, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "docs/hello.txt", Destination: "x/y/hello.txt"})); err != nil {
		t.Fatal(err)
	}
	owned(filepath.Join(home, "x/y"))
	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "x/y/hello.txt"}))
	if err != nil || st.Msg.GetEntry().GetOwner() != "user" || st.Msg.GetEntry().GetMode() != 0o644 || st.Msg.GetEntry().GetPermissions() != "-rw-r--r--" {
		t.Fatalf("stat: %v %v", st, err)
	}
	// A process of the user sees the file as its own.
	r, err = e.run(ctx, &ppb.StartRequest{Process: bash(`echo more >> x/y/hello.txt && cat x/y/hello.txt`)})
	if err != nil || r.stdout.String() != "himore\n" {
		t.Fatalf("user writes its file: %q %v", r.stdout.String(), err)
	}
	usersDenied(t, e, home)
}

// usersDenied: what the user may not touch, envd refuses as the kernel
// would refuse the user (permission_denied, 403), and it stays as it was;
// root's requests in between still act as root.
func usersDenied(t *testing.T, e *env, home string) {
	ctx := ctxT(t, 60*time.Second)
	private := filepath.Join(filepath.Dir(filepath.Dir(home)), "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(private, "secret")
	os.WriteFile(secret, []byte("root only"), 0o600)
	os.WriteFile(filepath.Join(home, "mine"), []byte("x"), 0o600) // root's file in the user's home
	denied := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Fatalf("%s: %v, want permission_denied", what, err)
		}
	}
	_, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: secret}))
	denied("stat", err)
	_, err = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: private}))
	denied("list", err)
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(private, "made")}))
	denied("makedir", err)
	_, err = e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: secret}))
	denied("remove", err)
	_, err = e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: secret, Destination: "stolen"}))
	denied("move", err)
	ws, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: private}))
	if err == nil {
		for ws.Receive() {
		}
		err = ws.Err()
	}
	denied("watch", err)
	for _, u := range []url.Values{{"path": {secret}}, {"path": {"mine"}}} {
		resp, body := e.do(t, mustReq(t, "GET", e.filesURL(u)))
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, `"code":403`) {
			t.Fatalf("download %v: %d %s", u, resp.StatusCode, body)
		}
	}
	up, _ := http.NewRequest("POST", e.filesURL(url.Values{"path": {filepath.Join(private, "planted")}}), strings.NewReader("no"))
	up.Header.Set("Content-Type", "application/octet-stream")
	if resp, body := e.do(t, up); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("upload into a root dir: %d %s", resp.StatusCode, body)
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "root only" {
		t.Fatalf("the secret changed: %q %v", b, err)
	}
	if ents, _ := os.ReadDir(private); len(ents) != 1 {
		t.Fatalf("%s has %d entries, want only the secret", private, len(ents))
	}
	if _, err := os.Stat(filepath.Join(home, "stolen")); err == nil {
		t.Fatal("the secret was moved out")
	}
	// Root, named by the request, still reads and writes as root: the
	// user's identity did not stay on the agent's threads.
	for range 20 {
		st := connect.NewRequest(&fspb.StatRequest{Path: secret})
		st.Header().Set("Authorization", basic("root"))
		if _, err := e.fs.Stat(ctx, st); err != nil {
			t.Fatalf("stat as root: %v", err)
		}
	}
	up, _ = http.NewRequest("POST", e.filesURL(url.Values{"path": {filepath.Join(private, "by-root")}, "username": {"root"}}), strings.NewReader("ok"))
	up.Header.Set("Content-Type", "application/octet-stream")
	if resp, body := e.do(t, up); resp.StatusCode != 200 {
		t.Fatalf("upload as root: %d %s", resp.StatusCode, body)
	}
	if fi, err := os.Stat(filepath.Join(private, "by-root")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("root's upload: %v", err)
	}
}
