package runtime

import (
	"debug/elf"
	"fmt"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// CheckAgentBinary reports whether path can serve as the in-sandbox agent:
// it is bind-mounted into images that have no C library, so it must be a
// static ELF executable (no PT_INTERP). A dynamically linked build
// (CGO_ENABLED=1) would otherwise fail in every sandbox with runc's
// "exec /.moat/moat-agent: no such file or directory".
func CheckAgentBinary(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("agent binary %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("agent binary %s is dynamically linked; build it with CGO_ENABLED=0 (make build): %w", path, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}
