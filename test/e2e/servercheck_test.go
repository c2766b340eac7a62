package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Every e2e server is checked when its test ends: the run fails if the
// server logged a recovered (or unrecovered) panic, or answered a 5xx. The answers are counted by the
// server itself (moat_http_requests_total, by route pattern and code),
// read before each stop, kill or restart and summed; so a 5xx any client
// got (the SDKs, the CLI, a proxy client) is seen, not only those of
// server.do.
//
// Not counted as a failure: 501 (a documented refusal of a feature the
// runtime does not have), and 502/503/504 on the data-plane routes (the
// server proxy, the E2B edge, unmatched hosts), where they report the
// state of a sandbox's port, which tests poll until it listens; nor a 5xx
// a test provoked and checked itself (expect5xx).

// serverCheck is the state of a server's check.
type serverCheck struct {
	seen     map[string]float64 // "code route" -> count, summed over restarts
	expected map[string]float64 // "code route" -> count the test provoked
}

// expect5xx records that the test provokes (and checks) one answer code
// on route (the pattern, as moat_http_requests_total names it).
func (s *server) expect5xx(code int, route string) {
	if s.check.expected == nil {
		s.check.expected = map[string]float64{}
	}
	s.check.expected[fmt.Sprintf("%d %s", code, route)]++
}

var requestsLine = regexp.MustCompile(`^moat_http_requests_total\{code="(\d+)",route="((?:[^"\\]|\\.)*)"\} (\S+)$`)

// scrape5xx adds the running server's 5xx counts to s.check.seen. A server
// that does not answer (hung, killed, started without the test's key) is
// not checked.
func (s *server) scrape5xx() {
	if s.cmd == nil {
		return
	}
	req, _ := http.NewRequest("GET", "http://"+s.addr+"/metrics", nil)
	req.Header.Set("OPEN-SANDBOX-API-KEY", s.key)
	resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		io.Copy(io.Discard, resp.Body)
		return
	}
	if s.check.seen == nil {
		s.check.seen = map[string]float64{}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m := requestsLine.FindStringSubmatch(sc.Text())
		if m == nil || m[1][0] != '5' {
			continue
		}
		n, err := strconv.ParseFloat(m[3], 64)
		if err != nil || n == 0 {
			continue
		}
		s.check.seen[m[1]+" "+m[2]] += n
	}
}

// dataPlane reports a route whose 502/503/504 report a sandbox port.
func dataPlane(route string) bool {
	return route == "unmatched" || route == "e2b edge" || strings.Contains(route, "/proxy/")
}

// unexpected5xx lists the 5xx answers outside the exceptions above.
func (c *serverCheck) unexpected5xx() []string {
	var out []string
	for key, n := range c.seen {
		codeS, route, _ := strings.Cut(key, " ")
		code, _ := strconv.Atoi(codeS)
		if code == http.StatusNotImplemented || (dataPlane(route) && code >= 502 && code <= 504) {
			continue
		}
		if n -= c.expected[key]; n <= 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%d on %q (%v times)", code, route, n))
	}
	slices.Sort(out)
	return out
}

// panicLines are the lines of a server log that report a panic: the
// handler recoverers' (web.Recover, net/http's own) and an unrecovered
// panic's.
var panicLine = regexp.MustCompile(`msg="handler panic"|http: panic serving|^panic: |^fatal error: `)

func panicsIn(logFile string) []string {
	f, err := os.Open(logFile)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		if panicLine.MatchString(sc.Text()) {
			out = append(out, tail(sc.Text(), 2000))
		}
	}
	return out
}

// verify fails the test for the server's panics and unexpected 5xx
// answers. It runs at cleanup, after the server stopped.
func (s *server) verify() {
	if p := panicsIn(s.logf.Name()); len(p) > 0 {
		s.t.Errorf("the server logged %d panic(s):\n%s", len(p), strings.Join(p, "\n"))
	}
	if u := s.check.unexpected5xx(); len(u) > 0 {
		s.t.Errorf("the server answered 5xx responses: %s", strings.Join(u, "; "))
	}
}
