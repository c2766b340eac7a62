package mitm

import (
	"fmt"
	"testing"
	"time"
)

// The throttle lets a key through once per interval, and tracks at most
// its bound of keys: a new key waits while the table is full of keys
// that went through within the interval, and gets through once one of
// them is older.
func TestThrottleOncePerIntervalWithBoundedKeys(t *testing.T) {
	now := time.Unix(1000, 0)
	th := newThrottle(time.Minute, 3, func() time.Time { return now })
	step := func(d time.Duration) { now = now.Add(d) }
	for _, c := range []struct {
		key  string
		want bool
	}{
		{"a", true},
		{"a", false}, // within the minute
		{"b", true},
		{"c", true},
		{"d", false}, // three keys tracked, none older than a minute
	} {
		if got := th.allow(c.key); got != c.want {
			t.Fatalf("allow(%q) = %v, want %v", c.key, got, c.want)
		}
		step(time.Second)
	}
	step(time.Minute - 4*time.Second) // "a" went through a minute ago, "b" and "c" later
	if !th.allow("a") {
		t.Fatal("a key was held back a minute after it went through")
	}
	if th.allow("d") {
		t.Fatal("a new key got through while the table is full of recent keys")
	}
	step(2 * time.Second) // now "b" and "c" are a minute old
	if !th.allow("d") || !th.allow("e") {
		t.Fatal("new keys were held back after the old ones expired")
	}
	if len(th.last) > 3 {
		t.Fatalf("the throttle tracks %d keys, bound 3", len(th.last))
	}
}

// Whatever a sandbox sends, the table stays within its bound and at most
// that many keys get through per interval.
func TestThrottleMemoryIsBounded(t *testing.T) {
	now := time.Unix(0, 0)
	th := newThrottle(WithheldInterval, MaxWithheldKeys, func() time.Time { return now })
	through := 0
	for i := range 10 * MaxWithheldKeys {
		if th.allow(fmt.Sprint("api\x00h", i, ".test")) {
			through++
		}
		now = now.Add(time.Millisecond)
	}
	if through != MaxWithheldKeys || len(th.last) != MaxWithheldKeys {
		t.Fatalf("%d keys through, %d tracked; want %d", through, len(th.last), MaxWithheldKeys)
	}
}
