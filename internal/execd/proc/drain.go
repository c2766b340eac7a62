package proc

import (
	"os"
	"syscall"
)

// Drain reads what the kernel has buffered in the pipe r without
// blocking, handing each chunk to deliver, and reports whether it reached
// EOF (every writer is gone). The output copiers of commands and code
// contexts use it once a child has exited (or at a barrier), so that the
// output written before is delivered even while a grandchild still holds
// the pipe open.
func Drain(r *os.File, buf []byte, deliver func([]byte)) (eof bool) {
	rc, err := r.SyscallConn()
	if err != nil {
		return false
	}
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = syscall.Read(int(fd), buf)
			return true
		}); err != nil {
			return false
		}
		if rerr == syscall.EINTR {
			continue
		}
		if rerr != nil {
			return false // EAGAIN: nothing more buffered
		}
		if n == 0 {
			return true
		}
		deliver(buf[:n])
	}
}
