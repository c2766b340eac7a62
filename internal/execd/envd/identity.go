package envd

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// as runs fn with the calling thread's filesystem identity set to a's
// (fsuid, fsgid and supplementary groups), so the kernel checks a's
// permissions for every path fn touches and what fn creates is a's,
// while the agent stays root. The three are per-thread in Linux (and
// gVisor): the goroutine is locked to its thread for fn, and a thread the
// runtime starts meanwhile comes from its template thread, not this one.
// The agent's own identity (not root, or a root request) runs fn as is.
func (a account) as(fn func() error) error {
	if os.Getuid() != 0 || a.uid == 0 {
		return fn()
	}
	runtime.LockOSThread()
	groups, err := unix.Getgroups()
	if err == nil {
		err = a.enter()
	}
	if err != nil {
		if leave(groups) == nil {
			runtime.UnlockOSThread()
		}
		return fmt.Errorf("act as %s: %w", a.name, err)
	}
	ferr := fn()
	if leave(groups) == nil {
		runtime.UnlockOSThread()
	} // else the thread stays locked and ends with the goroutine
	return ferr
}

// enter switches the thread to a's filesystem identity: groups first,
// then gid, then uid (which drops the filesystem capabilities).
func (a account) enter() error {
	gids := make([]int, len(a.groups))
	for i, g := range a.groups {
		gids[i] = int(g)
	}
	if err := unix.Setgroups(gids); err != nil {
		return err
	}
	if _, err := unix.SetfsgidRetGid(a.gid); err != nil {
		return err
	}
	if _, err := unix.SetfsuidRetUid(a.uid); err != nil {
		return err
	}
	// setfs[ug]id report no failure: read the values back.
	uid, _ := unix.SetfsuidRetUid(-1)
	gid, _ := unix.SetfsgidRetGid(-1)
	if uid != a.uid || gid != a.gid {
		return fmt.Errorf("filesystem identity is %d:%d, want %d:%d", uid, gid, a.uid, a.gid)
	}
	return nil
}

// leave restores the agent's root filesystem identity and groups.
func leave(groups []int) error {
	unix.SetfsuidRetUid(0)
	unix.SetfsgidRetGid(0)
	if uid, _ := unix.SetfsuidRetUid(-1); uid != 0 {
		return fmt.Errorf("filesystem uid stays %d", uid)
	}
	if gid, _ := unix.SetfsgidRetGid(-1); gid != 0 {
		return fmt.Errorf("filesystem gid stays %d", gid)
	}
	return unix.Setgroups(groups)
}
