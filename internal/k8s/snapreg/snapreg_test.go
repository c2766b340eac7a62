package snapreg

import "testing"

func TestPinned(t *testing.T) {
	for _, c := range []struct{ image, want string }{
		{"127.0.0.1:5000/ns/snap:sandbox", "127.0.0.1:5000/ns/snap@sha256:ab"},
		{"registry.example/p/ns/snap:main", "registry.example/p/ns/snap@sha256:ab"},
		{"127.0.0.1:5000/ns/snap", "127.0.0.1:5000/ns/snap@sha256:ab"},
	} {
		if got := Pinned(c.image, "sha256:ab"); got != c.want {
			t.Errorf("Pinned(%q) = %q, want %q", c.image, got, c.want)
		}
	}
}

func TestRefBelowRegistry(t *testing.T) {
	r := Registry{Host: "127.0.0.1:5000/snaps"}
	if _, err := r.Ref("127.0.0.1:5000/snaps/ns/s:c"); err != nil {
		t.Errorf("an image below the registry: %v", err)
	}
	for _, ref := range []string{"127.0.0.1:5000/other/ns/s:c", "127.0.0.1:5000/snapsx/s:c", "evil.example/snaps/s:c"} {
		if _, err := r.Ref(ref); err == nil {
			t.Errorf("%s accepted outside the registry", ref)
		}
	}
	if _, err := (Registry{}).Ref("127.0.0.1:5000/ns/s:c"); err == nil {
		t.Error("a registry without a host accepted an image")
	}
}
