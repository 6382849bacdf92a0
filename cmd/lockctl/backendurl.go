package main

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/distlock/lock"
)

// How lockctl gets the backend URL, safest first:
//
//   - LOCK_BACKEND, an environment variable: only the user (and root) can
//     read a process's environment. lockctl run takes it out of the
//     command's environment (--keep-backend-env keeps it).
//   - --backend-file PATH: the URL read from a file, such as one a
//     secrets manager writes (surrounding whitespace trimmed).
//   - --backend URL: on the command line, which every local user can read
//     in ps and /proc/PID/cmdline while lockctl runs. lockctl warns when
//     such a URL carries credentials.
//
// Whichever way it came, lockctl shows the URL only as lock.RedactURL
// gives it, and cuts its secrets out of every error it prints.

// backendEnv is the environment variable that names the backend.
const backendEnv = "LOCK_BACKEND"

// maxBackendFile bounds what --backend-file reads: a URL, not a file of
// any size.
const maxBackendFile = 64 << 10

// backendFlags are the --backend and --backend-file flags of a command.
type backendFlags struct {
	fs         *flags
	url, file  *string
	defaultURL string // the URL without flag or LOCK_BACKEND: "" for none
}

// addBackendFlags defines --backend and --backend-file on fs. def is the
// backend used when neither they nor LOCK_BACKEND name one ("" for none);
// what says which backends the command takes, for the usage text.
func addBackendFlags(fs *flags, def, what string) *backendFlags {
	dflt := "$" + backendEnv
	if def != "" {
		dflt += ", else " + def
	}
	return &backendFlags{
		fs: fs,
		url: fs.String("backend", "", "backend `URL`"+what+"; every local user can read it in ps while lockctl runs: "+
			"give one with credentials in $"+backendEnv+" or --backend-file (default: "+dflt+")"),
		file:       fs.String("backend-file", "", "read the backend URL from the file at `PATH` (surrounding whitespace trimmed); not with --backend"),
		defaultURL: def,
	}
}

// backend returns the backend URL the user chose: --backend, else
// --backend-file, else LOCK_BACKEND, else the command's default. It
// prints the warnings about the URL (credentials on the command line,
// skip_verify) to stderr, and remembers the URL's secrets so that no
// error lockctl prints shows them. ok is false, with the status to
// return, after a usage error.
func (e *environment) backend(b *backendFlags) (rawURL string, code int, ok bool) {
	cmd := b.fs.cmd
	fromFlag := b.fs.set("backend")
	switch {
	case fromFlag && b.fs.set("backend-file"):
		return "", e.usageError(cmd, "give --backend or --backend-file, not both"), false
	case fromFlag:
		rawURL = *b.url
	case b.fs.set("backend-file"):
		u, err := readBackendFile(*b.file)
		if err != nil {
			return "", e.usageError(cmd, "--backend-file: %s", err.Error()), false
		}
		rawURL = u
	default:
		rawURL = e.getenv(backendEnv)
		if rawURL == "" {
			rawURL = b.defaultURL
		}
	}
	if rawURL == "" {
		return "", e.usageError(cmd, "no backend: set %s, or give --backend-file PATH or --backend URL (schemes: %s)", backendEnv, strings.Join(lock.Schemes(), ", ")), false
	}
	e.rawURL = rawURL
	if fromFlag && carriesCredentials(rawURL) {
		e.printf(e.stderr, "lockctl %s: warning: the --backend URL carries credentials, and every local user can read lockctl's command line (ps, /proc/PID/cmdline) while it runs; set %s or give --backend-file PATH instead\n", cmd, backendEnv)
	}
	if lock.SkipsVerify(rawURL) {
		e.printf(e.stderr, "lockctl %s: warning: skip_verify=true: the backend's TLS certificate is not checked, so anyone on the network path can read and change the traffic, credentials included\n", cmd)
	}
	return rawURL, exitOK, true
}

// carriesCredentials reports whether rawURL carries a secret: something
// lock.RedactURL hides, in a URL with a userinfo, a query or a fragment.
// (RedactURL also hides the opaque part of "host:6379", read as scheme
// "host", which is no secret.)
func carriesCredentials(rawURL string) bool {
	return lock.URLHasSecrets(rawURL) && strings.ContainsAny(rawURL, "@?#")
}

// readBackendFile reads the backend URL from the file at path.
func readBackendFile(path string) (string, error) {
	if path == "" {
		return "", errors.New("empty path; want --backend-file PATH, a file that holds the backend URL")
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxBackendFile+1))
	if err != nil {
		return "", err
	}
	if len(data) > maxBackendFile {
		return "", fmt.Errorf("%s is larger than %d KiB: want a file that holds the backend URL", path, maxBackendFile>>10)
	}
	u := strings.TrimSpace(string(data))
	if u == "" {
		return "", fmt.Errorf("%s is empty: want a file that holds the backend URL", path)
	}
	return u, nil
}

// scrub returns s with every secret of the backend URL cut out.
func (e *environment) scrub(s string) string {
	if e.rawURL == "" {
		return s
	}
	return lock.RedactText(s, e.rawURL)
}

// urlTTL is the ttl parameter of a URL that lock.Open accepted, if it has
// one.
func urlTTL(rawURL string) (time.Duration, bool) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, false
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil || !q.Has("ttl") {
		return 0, false
	}
	d, err := time.ParseDuration(q.Get("ttl"))
	return d, err == nil
}
