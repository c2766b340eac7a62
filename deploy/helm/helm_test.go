// Package helm_test checks the Helm chart with helm itself (built from the
// Go module proxy by scripts/build-k8s-tools.sh): `helm lint` passes and
// `helm template` renders the objects the controller needs.
package helm_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

func helm(t *testing.T) string {
	t.Helper()
	p := filepath.Join(k8stest.AssetsDir(), "helm")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv(k8stest.RequireEnv) != "" {
			t.Fatalf("helm not built in %s (run scripts/build-k8s-tools.sh)", k8stest.AssetsDir())
		}
		t.Skipf("helm not built in %s (run scripts/build-k8s-tools.sh)", k8stest.AssetsDir())
	}
	return p
}

func run(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.Bytes()
}

func TestLint(t *testing.T) {
	out := run(t, "lint", "--strict", "moat")
	if !bytes.Contains(out, []byte("0 chart(s) failed")) {
		t.Errorf("helm lint:\n%s", out)
	}
}

func TestTemplate(t *testing.T) {
	out := run(t, "template", "r1", "moat", "--namespace", "moat-system", "--include-crds",
		"--set", "replicas=2", "--set", "hostNetwork=true", "--set", "apiServer.host=127.0.0.1", "--set", "apiServer.port=6443",
		"--set", "image.repository=registry.example.com/moat", "--set", "image.tag=v1")
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	kinds := map[string]*unstructured.Unstructured{}
	for {
		var o unstructured.Unstructured
		if err := dec.Decode(&o.Object); err != nil {
			break
		}
		if len(o.Object) > 0 {
			kinds[o.GetKind()+"/"+o.GetName()] = &o
		}
	}
	for _, want := range []string{
		"CustomResourceDefinition/pools.sandbox.opensandbox.io",
		"CustomResourceDefinition/batchsandboxes.sandbox.opensandbox.io",
		"CustomResourceDefinition/sandboxsnapshots.sandbox.opensandbox.io",
		"ServiceAccount/r1-controller", "ClusterRole/r1-controller", "ClusterRoleBinding/r1-controller",
		"ClusterRole/r1-server", "Deployment/r1-controller",
	} {
		if kinds[want] == nil {
			t.Errorf("helm template lacks %s (has %v)", want, keys(kinds))
		}
	}
	d := kinds["Deployment/r1-controller"]
	if d == nil {
		return
	}
	c, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	ctr := c[0].(map[string]any)
	args := strings.Join(toStrings(ctr["args"]), " ")
	for _, want := range []string{"--agent-image=registry.example.com/moat:v1", "--k8s-api-qps=200", "--k8s-api-burst=400", "--leader-elect", "--leader-elect-namespace=moat-system",
		"--sandbox-ingress-namespace=moat-system"} {
		if !strings.Contains(args, want) {
			t.Errorf("controller args %q lack %q", args, want)
		}
	}
	if hn, _, _ := unstructured.NestedBool(d.Object, "spec", "template", "spec", "hostNetwork"); !hn {
		t.Error("hostNetwork not set")
	}
	if env := ctr["env"]; !strings.Contains(strings.ReplaceAll(toJSONish(env), " ", ""), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("env %v lacks the API server override", env)
	}
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func toJSONish(v any) string {
	var b strings.Builder
	for _, x := range v.([]any) {
		for k, val := range x.(map[string]any) {
			b.WriteString(k + "=" + val.(string) + ";")
		}
	}
	return b.String()
}

// TestDefaultImage: without --set, the controller runs the image `make
// release` builds: ghcr.io/moat-sandbox/moat:v<the chart's appVersion>.
func TestDefaultImage(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join("moat", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var app string
	for _, l := range strings.Split(string(chart), "\n") {
		if v, ok := strings.CutPrefix(l, "appVersion:"); ok {
			app = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	if app == "" {
		t.Fatalf("no appVersion in Chart.yaml:\n%s", chart)
	}
	out := string(run(t, "template", "r1", "moat", "--namespace", "moat-system"))
	want := "ghcr.io/moat-sandbox/moat:v" + app
	if !strings.Contains(out, "image: "+want+"\n") || !strings.Contains(out, "--agent-image="+want+"\n") {
		t.Errorf("helm template renders no image %s:\n%s", want, out)
	}
}

// TestTenantNamespacesRBAC: serverRole.tenantNamespaces adds the rules
// tenant namespaces need and, with a service account, binds the server
// role cluster-wide; by default neither.
func TestTenantNamespacesRBAC(t *testing.T) {
	render := func(args ...string) map[string]*unstructured.Unstructured {
		out := run(t, append([]string{"template", "r1", "moat", "--namespace", "moat-system", "--show-only", "templates/server-role.yaml"}, args...)...)
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
		objs := map[string]*unstructured.Unstructured{}
		for {
			var o unstructured.Unstructured
			if err := dec.Decode(&o.Object); err != nil {
				break
			}
			if len(o.Object) > 0 {
				objs[o.GetKind()+"/"+o.GetName()] = &o
			}
		}
		return objs
	}
	resources := func(role *unstructured.Unstructured) string {
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		var b strings.Builder
		for _, r := range rules {
			b.WriteString(strings.Join(toStrings(r.(map[string]any)["resources"]), ",") + ";")
		}
		return b.String()
	}
	def := render()
	if def["ClusterRole/r1-server"] == nil || def["ClusterRoleBinding/r1-server"] != nil ||
		strings.Contains(resources(def["ClusterRole/r1-server"]), "networkpolicies") {
		t.Errorf("default server role: %v, %s", keys(def), resources(def["ClusterRole/r1-server"]))
	}
	tn := render("--set", "serverRole.tenantNamespaces.enabled=true", "--set", "serverRole.tenantNamespaces.serviceAccount.name=moat-server")
	res := resources(tn["ClusterRole/r1-server"])
	for _, want := range []string{"namespaces;", "resourcequotas,limitranges;", "networkpolicies;"} {
		if !strings.Contains(res, want) {
			t.Errorf("tenant-namespace server role lacks %s: %s", want, res)
		}
	}
	b := tn["ClusterRoleBinding/r1-server"]
	if b == nil {
		t.Fatalf("no ClusterRoleBinding: %v", keys(tn))
	}
	subj, _, _ := unstructured.NestedSlice(b.Object, "subjects")
	if s := subj[0].(map[string]any); s["name"] != "moat-server" || s["namespace"] != "moat-system" {
		t.Errorf("binding subject %v", s)
	}
}

// TestNodeDaemonSet: moat node runs on every node with only the
// privileges it documents: the containerd socket (hostPath), as root
// with every capability dropped, a read-only root, no port, no host
// namespaces beyond the chart's hostNetwork; pods read and pods/status
// patched, nothing else. node.enabled=false leaves it out.
func TestNodeDaemonSet(t *testing.T) {
	objs := func(args ...string) map[string]*unstructured.Unstructured {
		out := run(t, append([]string{"template", "r1", "moat", "--namespace", "moat-system"}, args...)...)
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
		kinds := map[string]*unstructured.Unstructured{}
		for {
			var o unstructured.Unstructured
			if err := dec.Decode(&o.Object); err != nil {
				break
			}
			if len(o.Object) > 0 {
				kinds[o.GetKind()+"/"+o.GetName()] = &o
			}
		}
		return kinds
	}
	kinds := objs("--set", "node.containerdSocket=/run/k3s/containerd/containerd.sock")
	ds := kinds["DaemonSet/r1-node"]
	if ds == nil {
		t.Fatalf("no DaemonSet/r1-node (has %v)", keys(kinds))
	}
	spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	for _, k := range []string{"hostPID", "hostIPC", "hostNetwork"} {
		if spec[k] != nil {
			t.Errorf("node pod sets %s", k)
		}
	}
	vols := spec["volumes"].([]any)
	if len(vols) != 1 || toJSONishMap(vols[0].(map[string]any)["hostPath"]) != "path=/run/k3s/containerd/containerd.sock;type=Socket;" {
		t.Errorf("node volumes %v, want the containerd socket only", vols)
	}
	ctr := spec["containers"].([]any)[0].(map[string]any)
	if ctr["ports"] != nil {
		t.Errorf("node container has ports %v", ctr["ports"])
	}
	sc := ctr["securityContext"].(map[string]any)
	if sc["privileged"] == true || sc["allowPrivilegeEscalation"] != false || sc["readOnlyRootFilesystem"] != true ||
		strings.Join(toStrings(sc["capabilities"].(map[string]any)["drop"]), ",") != "ALL" || sc["capabilities"].(map[string]any)["add"] != nil {
		t.Errorf("node securityContext %v", sc)
	}
	if args := strings.Join(toStrings(ctr["args"]), " "); !strings.Contains(args, "--containerd-socket=/run/moat-node/containerd.sock") {
		t.Errorf("node args %q", args)
	}
	role := kinds["ClusterRole/r1-node"]
	if role == nil {
		t.Fatal("no ClusterRole/r1-node")
	}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	var got []string
	for _, r := range rules {
		m := r.(map[string]any)
		got = append(got, strings.Join(toStrings(m["resources"]), ",")+":"+strings.Join(toStrings(m["verbs"]), ","))
	}
	if strings.Join(got, " ") != "pods:get,list,watch pods/status:patch" {
		t.Errorf("node rules %v", got)
	}
	if kinds["ClusterRoleBinding/r1-node"] == nil || kinds["ServiceAccount/r1-node"] == nil {
		t.Error("node binding or service account missing")
	}
	// The controller's Deployment does not select the node's pods.
	d := kinds["Deployment/r1-controller"]
	sel, _, _ := unstructured.NestedStringMap(d.Object, "spec", "selector", "matchLabels")
	lbl, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels")
	if sel["app.kubernetes.io/component"] == lbl["app.kubernetes.io/component"] {
		t.Errorf("the controller's selector %v matches the node pods' labels %v", sel, lbl)
	}
	// With a snapshot registry, moat node may read SandboxSnapshots and
	// answer in their status, and both components name the registry.
	snap := objs("--set", "snapshots.registry=registry.example:5000/snaps")
	rules, _, _ = unstructured.NestedSlice(snap["ClusterRole/r1-node"].Object, "rules")
	got = nil
	for _, r := range rules {
		m := r.(map[string]any)
		got = append(got, strings.Join(toStrings(m["resources"]), ",")+":"+strings.Join(toStrings(m["verbs"]), ","))
	}
	if strings.Join(got, " ") != "pods:get,list,watch pods/status:patch sandboxsnapshots:get,list,watch sandboxsnapshots/status:update" {
		t.Errorf("node rules with snapshots %v", got)
	}
	for _, k := range []string{"DaemonSet/r1-node", "Deployment/r1-controller"} {
		cs, _, _ := unstructured.NestedSlice(snap[k].Object, "spec", "template", "spec", "containers")
		if args := strings.Join(toStrings(cs[0].(map[string]any)["args"]), " "); !strings.Contains(args, "--snapshot-registry=registry.example:5000/snaps") {
			t.Errorf("%s args %q", k, args)
		}
	}
	if off := objs("--set", "node.enabled=false"); off["DaemonSet/r1-node"] != nil || off["ClusterRole/r1-node"] != nil {
		t.Error("node.enabled=false still renders moat node")
	}
}

func toJSONishMap(v any) string {
	m, _ := v.(map[string]any)
	var b strings.Builder
	for _, k := range []string{"path", "type"} {
		if s, ok := m[k].(string); ok {
			b.WriteString(k + "=" + s + ";")
		}
	}
	return b.String()
}
