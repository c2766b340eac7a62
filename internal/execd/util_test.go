package execd

import (
	"net"
	"os"
	"strconv"
)

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

type net_TCPAddr = net.TCPAddr

func itoa(n int) string { return strconv.Itoa(n) }
