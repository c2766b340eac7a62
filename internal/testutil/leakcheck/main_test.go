//go:build linux

package main

import (
	"slices"
	"testing"
)

func TestClassify(t *testing.T) {
	prev := []string{"link moat0", "cgroup pids/moat/abc", "netns other"}
	now := []string{
		"link moat0",                        // existed before
		"link moatn1f3",                     // a free lease's bridge
		"netns moatn2aa-out",                // a live test's
		"nft table 1 moat-host-moatn1f3",    // a free lease's
		"mount /tmp/run/tmp/x/run/bin/runc", // under the run
		"mount /tmp/elsewhere/moat",         // not the run's
		"cgroup pids/moat/def",              // a server's, unattributed
		"cgroup pids/moat-test/moatn1f3/id", // a free lease's
		"link mv0123",                       // unattributed veth
	}
	held := func(name string) bool { return name == "moatn2aa" }
	leaks, others := classify("/tmp/run", prev, now, held)
	wantLeaks := []string{"link moatn1f3", "nft table 1 moat-host-moatn1f3", "mount /tmp/run/tmp/x/run/bin/runc", "cgroup pids/moat-test/moatn1f3/id"}
	wantOthers := []string{"mount /tmp/elsewhere/moat", "cgroup pids/moat/def", "link mv0123"}
	if !slices.Equal(leaks, wantLeaks) || !slices.Equal(others, wantOthers) {
		t.Fatalf("leaks %q\nothers %q", leaks, wantOthers)
	}
}
