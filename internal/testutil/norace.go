//go:build !race

package testutil

// RaceEnabled reports whether the test binary was built with -race: the
// detector slows code 5-20x, so stress tests scale their load down under
// it (they still run concurrently).
const RaceEnabled = false
