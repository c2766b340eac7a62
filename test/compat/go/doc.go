// Package compatgo drives a real `moat serve` with OpenSandbox's official
// Go SDK, used unchanged. It is its own module so the SDK never enters
// moat's go.mod; test/e2e's TestCompatGoSDK runs it with MOAT_URL,
// MOAT_API_KEY and MOAT_IMAGE set, and the tests skip without them.
package compatgo
