package redis

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/distlock/lock/backend"
)

// The openers' errors quote no secret of the URL, without lock.Open's
// scrub: each URL below carries the marker in its userinfo or a secret
// parameter (the values of other parameters are quoted: they are no
// secrets), and is refused.
func TestOpenErrorsQuoteNoSecret(t *testing.T) {
	const m = "S3cretMarker"
	openers := map[string]func(context.Context, *url.URL) (backend.Backend, error){
		"redis": openSingle, "rediss": openSingle, "unix": openSingle,
		"redis+cluster": openCluster, "rediss+cluster": openCluster,
		"redis+sentinel": openSentinel, "rediss+sentinel": openSentinel,
		"redlock": openRedlock, "redlocks": openRedlock,
	}
	for _, raw := range []string{
		"redis://u:" + m + "@127.0.0.1:1/notadb",
		"redis://u:" + m + "@127.0.0.1:1/1/2",
		"redis://u:" + m + "@127.0.0.1:1?dial_timeout=soon",
		"redis://u:" + m + "@127.0.0.1:1?durablefence=perhaps",
		"redis://u:" + m + "@127.0.0.1:1?password=" + m,
		"redis://u:" + m + "@127.0.0.1:1?ca_file=" + m,
		"rediss://u:" + m + "@127.0.0.1:1?ca_file=/nonexistent/ca.pem",
		"rediss://127.0.0.1:1?password=" + m + "&skip_verify=perhaps",
		"unix://u:" + m + "@?db=1",
		"redis+cluster://u:" + m + "@127.0.0.1:1/1",
		"redis+cluster://u:" + m + "@127.0.0.1:1,,127.0.0.1:2",
		"redis+cluster://u:" + m + "@127.0.0.1:1?addr=nohostport",
		"rediss+cluster://u:" + m + "@127.0.0.1:1?cert_file=/x",
		"redis+sentinel://u:" + m + "@127.0.0.1:1?password=" + m,
		"redis+sentinel://u:" + m + "@127.0.0.1:1?master_name=m&sentinel_password=" + m,
		"redis+sentinel://127.0.0.1:1?master_name=m&password=" + m + "&sentinel_password=" + m + "&db=x",
		"rediss+sentinel://u:" + m + "@127.0.0.1:1?master_name=m&ca_file=/nonexistent",
		"redlock://u:" + m + "@127.0.0.1:1,,127.0.0.1:2",
		"redlock://u:" + m + "@127.0.0.1:1/2",
		"redlock://u:" + m + "@127.0.0.1:1?password=" + m,
		"redlock://127.0.0.1:1?password=" + m + "&db=x",
		"redlock://u:" + m + "@127.0.0.1:1?maxttl=2y",
		"redlock://u:" + m + "@127.0.0.1:1?nodetimeout=2m",
		"redlock://u:" + m + "@127.0.0.1:1,127.0.0.1:1",
		"redlock://u:" + m + "@127.0.0.1:1,127.0.0.1:2",
		"redlock://u:" + m + "@no-such-host.invalid:1,127.0.0.1:2,127.0.0.1:3",
		"redlocks://u:" + m + "@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?key_file=/x",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		b, err := openers[u.Scheme](context.Background(), u)
		if err == nil {
			b.Close()
			t.Errorf("%s: opened; want an error", raw)
			continue
		}
		if strings.Contains(err.Error(), m) {
			t.Errorf("%s: the error quotes the secret: %v", raw, err)
		}
		if !errors.Is(err, backend.ErrInvalid) && !strings.Contains(raw, "no-such-host") {
			t.Errorf("%s: %v; want ErrInvalid", raw, err)
		}
	}
}
