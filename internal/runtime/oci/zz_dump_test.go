package oci

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/moat-sandbox/moat/internal/runtime"
)

func TestZZDump(t *testing.T) {
	s := buildSpec(bundleInput{ID: "x1", Hostname: "x1", Rootfs: "/tmp/bb/rootfs", Args: []string{"/bin/sleep", "100"}, Env: []string{defaultPath}, Cwd: "/",
		AgentBin: "/bin/busybox", AgentConf: "/etc/hostname", HostsFile: "/etc/hosts", HostnameFile: "/etc/hostname", ResolvConf: "/etc/resolv.conf", NetnsPath: "",
		Resources: runtime.Resources{PidsLimit: 100}})
	s.Linux.Namespaces[4].Path = ""
	data, _ := json.MarshalIndent(s, "", " ")
	os.WriteFile("/tmp/bb/config.json", data, 0o644)
}
