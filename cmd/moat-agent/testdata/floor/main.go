// Command floor is the smallest Go HTTP server that answers the agent's
// /ping: BenchmarkAgentStart starts it like the agent to show what a Go
// process with net/http costs to start on the machine, the floor under
// the agent's own start.
package main

import (
	"flag"
	"net"
	"net/http"
	"os"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:44772", "address")
	flag.String("state-dir", "", "ignored")
	flag.String("log-level", "", "ignored")
	flag.Parse()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		os.Exit(1)
	}
	http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
}
