package lifecycle

import (
	goruntime "runtime"
	"strconv"
	"strings"
)

func containsAny(s, chars string) bool { return strings.ContainsAny(s, chars) }

func parseInt(s string) (int, error) { return strconv.Atoi(strings.TrimSpace(s)) }

// hostArch is the OpenSandbox spelling of the host architecture.
func hostArch() string { return goruntime.GOARCH }
