// Command stubagent stands in for the moat agent (cmd/moat-agent) in
// backend tests that must not depend on it: invoked like the agent,
//
//	stubagent [execd] --config /.moat/agent.json -- [cmd...]
//
// it serves the agent protocol's routes (fakeagent.Agent: /ping and the
// /moat/v1 extensions, with the token check) on the configured port,
// starts cmd if given, and exits on SIGTERM. Build it with CGO_ENABLED=0.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/runtime/fake/fakeagent"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "execd" {
		args = args[1:]
	}
	conf := agentproto.ConfigPath
	var cmd []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--config":
			i++
			if i < len(args) {
				conf = args[i]
			}
		case "--":
			cmd = args[i+1:]
			i = len(args)
		}
	}
	var cfg agentproto.Config
	data, err := os.ReadFile(conf)
	if err == nil {
		err = json.Unmarshal(data, &cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stubagent:", err)
		os.Exit(2)
	}
	if cfg.Port == 0 {
		cfg.Port = agentproto.Port
	}
	l, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", cfg.Port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "stubagent:", err)
		os.Exit(2)
	}
	if len(cmd) > 0 {
		c := exec.Command(cmd[0], cmd[1:]...)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "stubagent: entrypoint:", err)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		os.Exit(0)
	}()
	http.Serve(l, fakeagent.New(cfg.Token))
}
