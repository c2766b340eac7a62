// Package buildinfo says which moat this is: the release version and
// commit that `make release` stamps in with -ldflags -X, else what the Go
// toolchain recorded (the module version, the VCS revision of a build
// from a checkout), and the Go version.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version and commit are set at link time:
//
//	-ldflags "-X github.com/moat-sandbox/moat/internal/buildinfo.version=v0.3.0
//	          -X github.com/moat-sandbox/moat/internal/buildinfo.commit=<sha>"
//
// They are the package's only variables, written by the linker alone.
var (
	version string
	commit  string
)

// Info describes the running binary.
type Info struct {
	// Version is the release version ("v0.3.0"), the module version of
	// a `go install`ed moat, or "devel".
	Version string `json:"version"`
	// Commit is the VCS revision ("" if unknown).
	Commit string `json:"commit,omitempty"`
	// Modified is set when the build's checkout had uncommitted changes.
	Modified bool `json:"modified,omitempty"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
}

// Read returns the running binary's Info.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return read(version, commit, bi)
}

// read is Read over the stamped values and the toolchain's record.
func read(version, commit string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if info.Commit == "" {
					info.Commit = s.Value
				}
			case "vcs.modified":
				// Only of the checkout the revision is from.
				info.Modified = s.Value == "true" && commit == ""
			}
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	return info
}
