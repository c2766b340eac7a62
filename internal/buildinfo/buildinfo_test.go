package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// TestRead: stamped values win over the toolchain's record, which fills
// what is not stamped; an unstamped checkout build is "devel".
func TestRead(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	for i, c := range []struct {
		version, commit string
		bi              *debug.BuildInfo
		want            Info
	}{
		{"v0.3.0", "f00d", vcs, Info{Version: "v0.3.0", Commit: "f00d", GoVersion: "go1.99.1"}},
		{"", "", vcs, Info{Version: "devel", Commit: "abc123", Modified: true, GoVersion: "go1.99.1"}},
		{"", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.1"}}, Info{Version: "v0.2.1", GoVersion: runtime.Version()}},
		{"", "", nil, Info{Version: "devel", GoVersion: runtime.Version()}},
	} {
		c.want.Platform = runtime.GOOS + "/" + runtime.GOARCH
		if got := read(c.version, c.commit, c.bi); got != c.want {
			t.Errorf("%d: %+v, want %+v", i, got, c.want)
		}
	}
}
