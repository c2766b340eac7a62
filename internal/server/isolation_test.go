package server

import (
	"strings"
	"testing"
)

func TestIsolationConfig(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string // substring of the error; "" = valid
	}{
		{func(c *Config) {}, ""},
		{func(c *Config) { c.AllowedHostPaths = []string{"/srv/data", "/mnt"} }, ""},
		{func(c *Config) { c.AllowedHostPaths = []string{"srv/data"} }, "allow-host-path"},
		{func(c *Config) { c.DiskQuota = "10Gi" }, ""},
		{func(c *Config) { c.DiskQuota = "lots" }, "disk-quota"},
		{func(c *Config) { c.DiskQuota = "-1Gi" }, "disk-quota"},
	} {
		c := Default()
		tc.mod(&c)
		err := c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", c.AllowedHostPaths, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("disk %q hosts %v: err %v, want %q", c.DiskQuota, c.AllowedHostPaths, err, tc.want)
		}
	}
	c := Default()
	c.DiskQuota = "64Mi"
	if n, err := c.diskQuotaBytes(); err != nil || n != 64<<20 {
		t.Fatalf("diskQuotaBytes = %d, %v", n, err)
	}
}
