package code

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux ABI, gVisor included).
const clockTick = 10 * time.Millisecond

// groupUsage is what /proc says of the processes of one process group.
type groupUsage struct {
	cpu      time.Duration // user + system time used so far
	running  bool          // a member is on a CPU or runnable (state R)
	nmembers int
}

// readGroupUsage sums /proc/PID/stat over the members of process group
// pgid (a kernel and whatever it started: the agent starts every kernel
// as a group leader).
func readGroupUsage(pgid int) groupUsage {
	var u groupUsage
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return u
	}
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ... utime(14) stime(15); comm may
		// hold spaces and parentheses, so fields count from the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 13 {
			continue
		}
		if pg, _ := strconv.Atoi(string(f[2])); pg != pgid {
			continue
		}
		ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
		st, _ := strconv.ParseInt(string(f[12]), 10, 64)
		u.cpu += time.Duration(ut+st) * clockTick
		u.running = u.running || string(f[0]) == "R"
		u.nmembers++
	}
	return u
}
