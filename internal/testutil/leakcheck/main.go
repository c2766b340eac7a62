//go:build linux

// Command leakcheck is the end-of-run check of `make test`: nothing the
// run made may stay behind on the host.
//
//	leakcheck snapshot RUNDIR   # before the tests: record what exists
//	leakcheck check RUNDIR      # after: fail on what the run left
//
// RUNDIR is the run's directory ($MOAT_TEST_RUN, with TMPDIR inside it).
// The check looks at bridges and other moat links, network namespaces,
// nft tables, mounts, cgroups and processes. A new object counts as the
// run's leak when it carries the name of a test network lease (package
// testnet) that no live test holds, lies under RUNDIR, is a process
// started by the run (the MOAT_TEST_RUN marker), or was reported by a
// lease's own cleanup (RUNDIR/leaks). Other new moat objects (a server
// someone started by hand, say) cannot be told from the run's own: they
// fail the check too, unless MOAT_TEST_SHARED=1 says the machine is
// shared, in which case they are only listed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "snapshot" && os.Args[1] != "check") {
		fmt.Fprintln(os.Stderr, "usage: leakcheck snapshot|check RUNDIR")
		os.Exit(2)
	}
	run, err := filepath.Abs(os.Args[2])
	if err != nil {
		fatal(err)
	}
	before := filepath.Join(run, "before.json")
	if os.Args[1] == "snapshot" {
		b, _ := json.Marshal(objects(run))
		if err := os.WriteFile(before, b, 0o644); err != nil {
			fatal(err)
		}
		return
	}
	var prev []string
	b, err := os.ReadFile(before)
	if err != nil {
		fatal(fmt.Errorf("no snapshot of the run (leakcheck snapshot %s first): %w", run, err))
	}
	if err := json.Unmarshal(b, &prev); err != nil {
		fatal(err)
	}
	leaks, others := classify(run, prev, objects(run), testnet.Held)
	leaks = append(leaks, markedProcesses(run)...)
	if j, err := os.ReadFile(filepath.Join(run, "leaks")); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(j)), "\n") {
			if l != "" {
				leaks = append(leaks, "reported by the test: "+l)
			}
		}
	}
	shared := os.Getenv("MOAT_TEST_SHARED") == "1"
	if !shared {
		leaks, others = append(leaks, others...), nil
	}
	for _, o := range others {
		fmt.Fprintf(os.Stderr, "leakcheck: new since the run started, not attributable to it (MOAT_TEST_SHARED=1): %s\n", o)
	}
	if len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "leakcheck: the test run left %d objects behind:\n  %s\n", len(leaks), strings.Join(leaks, "\n  "))
		if !shared {
			fmt.Fprintln(os.Stderr, "leakcheck: (on a machine shared with other moat work, MOAT_TEST_SHARED=1 only lists objects that cannot be attributed to the run)")
		}
		os.Exit(1)
	}
	fmt.Println("leakcheck: nothing left behind")
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "leakcheck:", err)
	os.Exit(2)
}

// classify splits the objects new since prev into the run's leaks and
// others. held reports whether a live test holds a lease.
func classify(run string, prev, now []string, held func(string) bool) (leaks, others []string) {
	had := map[string]bool{}
	for _, o := range prev {
		had[o] = true
	}
	for _, o := range now {
		if had[o] {
			continue
		}
		slot := testnet.SlotOf(o)
		switch {
		case slot != "" && held(slot):
			// a live test's
		case slot != "", strings.HasPrefix(o, "mount "+run+"/"):
			leaks = append(leaks, o)
		default:
			others = append(others, o)
		}
	}
	return leaks, others
}

// objects lists the host objects a moat test could leave.
func objects(run string) []string {
	var out []string
	if links, err := testnet.Dump(netlink.LinkList); err == nil {
		names := map[int]string{}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		for _, l := range links {
			a := l.Attrs()
			if strings.HasPrefix(a.Name, "moat") || strings.HasPrefix(a.Name, "mv") {
				o := "link " + a.Name
				if m := names[a.MasterIndex]; m != "" {
					o += " (port of " + m + ")"
				}
				out = append(out, o)
			}
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			out = append(out, "netns "+e.Name())
		}
	}
	if c, err := nftables.New(); err == nil {
		if tables, err := c.ListTables(); err == nil {
			for _, t := range tables {
				if strings.Contains(t.Name, "moat") {
					out = append(out, fmt.Sprintf("nft table %d %s", t.Family, t.Name))
				}
			}
		}
		c.CloseLasting()
	}
	out = append(out, mounts(run)...)
	out = append(out, cgroups()...)
	slices.Sort(out)
	return slices.Compact(out)
}

// mounts lists mount points under run, or with moat in their path, and
// every namespace file mount.
func mounts(run string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		mp, fstype := fields[4], fields[sep+1]
		if strings.HasPrefix(mp, run+"/") || strings.Contains(mp, "moat") || fstype == "nsfs" {
			out = append(out, "mount "+mp)
		}
	}
	return out
}

// cgroups lists the cgroups below every hierarchy's moat* directories
// (the parents themselves are shared and stay).
func cgroups() []string {
	var out []string
	tops, _ := filepath.Glob("/sys/fs/cgroup/*/moat*")
	v2, _ := filepath.Glob("/sys/fs/cgroup/moat*")
	for _, top := range append(tops, v2...) {
		filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || p == top {
				return nil
			}
			out = append(out, "cgroup "+strings.TrimPrefix(p, "/sys/fs/cgroup/"))
			return nil
		})
	}
	return out
}

// markedProcesses lists live processes started by the run (their
// environment carries MOAT_TEST_RUN=run).
func markedProcesses(run string) []string {
	want := testnet.EnvRun + "=" + run
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), want) {
			continue
		}
		if st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); strings.Contains(string(st), ") Z ") {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(strings.TrimSpace(string(cmd)), "\x00", " ")))
	}
	return out
}
