package serverproc_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/distlock/lock/conformance/serverproc"
)

// serveArg makes the test binary a line-echo server on the given port: the
// server process of these tests.
const serveArg = "-serverproc.echo="

func TestMain(m *testing.M) {
	for _, a := range os.Args[1:] {
		if port, ok := strings.CutPrefix(a, serveArg); ok {
			echo(port)
			return
		}
	}
	os.Exit(m.Run())
}

func echo(port string) {
	ln, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				fmt.Fprint(c, line)
			}
		}()
	}
}

// ask sends a line and waits for its echo, up to d.
func ask(addr string, d time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echo %q", line)
	}
	return nil
}

func TestStopContinueKillRestart(t *testing.T) {
	p := serverproc.Start(t, []string{os.Args[0], serveArg + serverproc.PortPlaceholder})
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a started server: %v", err)
	}
	p.Stop()
	if err := ask(p.Addr, 300*time.Millisecond); err == nil {
		t.Fatal("a stopped server answered")
	}
	p.Continue()
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a continued server: %v", err)
	}
	p.Kill()
	if p.Running() {
		t.Fatal("Running after Kill")
	}
	if err := ask(p.Addr, time.Second); err == nil {
		t.Fatal("a killed server answered")
	}
	p.Restart()
	if err := ask(p.Addr, 5*time.Second); err != nil {
		t.Fatalf("a restarted server on the same port: %v", err)
	}
}
