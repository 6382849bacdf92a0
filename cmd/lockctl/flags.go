package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/distlock/lock"
)

// flags is one command's flag set with lockctl's messages: a wrong value
// names its flag and says what is valid; --help prints the command's flags
// with their defaults.
type flags struct {
	*flag.FlagSet
	cmd      string
	synopsis string // the command line after "lockctl CMD"
	about    string // what --help says before the flags, if anything: lines of lockctl's own text
}

func newFlags(cmd, synopsis string) *flags {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &flags{FlagSet: fs, cmd: cmd, synopsis: synopsis}
}

// maxDuration is the longest duration any flag takes: lock.MaxTTL, a
// year. Past it a duration is a mistake (a unit typed wrong), and near
// time.Duration's limit the stores' arithmetic overflows.
const maxDuration = lock.MaxTTL

// durationRange says the valid range of a duration flag.
var durationRange = fmt.Sprintf("valid: 0s to %v (a year)", maxDuration)

// durationValue is a flag.Value for a duration that asks for a unit when
// given a bare number, and rejects negative values and values above
// maxDuration.
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil {
		return "0s"
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("a duration needs a unit: %ss, %sms or %sm", s, s, s)
		}
		return fmt.Errorf("want a duration such as 500ms, 10s or 2m; %s", durationRange)
	}
	if d < 0 {
		return fmt.Errorf("want a duration of 0 or more; %s", durationRange)
	}
	if d > maxDuration {
		return fmt.Errorf("%v is more than a year; %s", d, durationRange)
	}
	*v.d = d
	return nil
}

// Duration defines a duration flag with lockctl's messages.
func (f *flags) Duration(name string, value time.Duration, usage string) *time.Duration {
	d := value
	f.Var(durationValue{&d}, name, usage)
	return &d
}

// set reports whether the user gave flag name.
func (f *flags) set(name string) bool {
	found := false
	f.Visit(func(fl *flag.Flag) { found = found || fl.Name == name })
	return found
}

// parse parses args. On --help it prints the command's flags to stdout;
// on an error it prints one line naming the flag. ok is false when the
// command should return code at once.
func (e *environment) parse(f *flags, args []string) (code int, ok bool) {
	err := f.Parse(args)
	if err == nil {
		return exitOK, true
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(e.stdout, "usage: lockctl %s %s\n", f.cmd, f.synopsis)
		if f.about != "" {
			fmt.Fprint(e.stdout, strings.TrimRight(f.about, "\n")+"\n")
		}
		fmt.Fprint(e.stdout, "flags:\n")
		f.VisitAll(func(fl *flag.Flag) {
			kind, usage := flag.UnquoteUsage(fl)
			if _, ok := fl.Value.(durationValue); ok {
				kind = "D"
			}
			fmt.Fprintf(e.stdout, "  %s\n    \t%s", strings.TrimSpace("--"+fl.Name+" "+kind), usage)
			if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0s" && !strings.Contains(usage, "default") {
				fmt.Fprintf(e.stdout, " (default %s)", fl.DefValue)
			}
			fmt.Fprintln(e.stdout)
		})
		return exitOK, false
	}
	msg := strings.ReplaceAll(err.Error(), " -", " --") // the flag package names flags with one dash
	if strings.HasPrefix(msg, "flag provided but not defined") {
		var names []string
		f.VisitAll(func(fl *flag.Flag) { names = append(names, "--"+fl.Name) })
		msg = fmt.Sprintf("unknown flag %s; valid flags: %s", strings.TrimPrefix(msg, "flag provided but not defined: "), strings.Join(names, ", "))
	}
	return e.usageError(f.cmd, "%s", msg), false
}

// noArgs fails with a usage error when the command was given arguments
// besides its flags.
func (e *environment) noArgs(f *flags) (int, bool) {
	if f.NArg() == 0 {
		return exitOK, true
	}
	if strings.HasPrefix(f.Arg(0), "-") {
		return e.usageError(f.cmd, "unknown flag %s; see lockctl %s --help", argText(f.Arg(0)), f.cmd), false
	}
	return e.usageError(f.cmd, "takes no arguments, got %s; see lockctl %s --help", quoted(argsText(f.Args())), f.cmd), false
}

// argText is a command-line argument as lockctl's messages quote it: one
// that may be a backend URL, given in the wrong place (--backend=URL after
// KEY, a URL without --backend), is redacted (lock.RedactURL).
func argText(a string) string {
	if name, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "-") {
		return name + "=" + argText(value)
	}
	if strings.Contains(a, "://") || strings.Contains(a, "@") {
		return lock.RedactURL(a)
	}
	return a
}

// argsText is args as argText quotes them, joined by spaces.
func argsText(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = argText(a)
	}
	return strings.Join(out, " ")
}
