package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/distlock/lock"
	_ "github.com/distlock/lock/memory"
)

// marker is the secret every case hides.
const marker = "S3cretMarker"

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://admin:" + marker + "@h:6379/0", "redis://admin:xxxxx@h:6379/0"},
		{"redis://:" + marker + "@h", "redis://:xxxxx@h"},
		{"redis://" + marker + "@h", "redis://xxxxx@h"},
		{"redis://admin:@h", "redis://admin:xxxxx@h"},
		{"redlock://a,b,c?password=" + marker + "&db=2", "redlock://a,b,c?password=xxxxx&db=2"},
		{"redis+sentinel://s1?sentinel_password=" + marker + "&master_name=m", "redis+sentinel://s1?sentinel_password=xxxxx&master_name=m"},
		{"consul://h/x?token=" + marker, "consul://h/x?token=xxxxx"},
		{"consul://h?Token=" + marker + ";prefix=x", "consul://h?Token=xxxxx;prefix=x"},
		{"consul://h?to%zzken=" + marker, "consul://h?xxxxx"},
		{"consul://h?password=", "consul://h?password=xxxxx"},
		{"//admin:" + marker + "@127.0.0.1:1", "//admin:xxxxx@127.0.0.1:1"},
		{"admin:" + marker + "@127.0.0.1:1", "admin:xxxxx"},
		{marker, "xxxxx"},
		{"", "xxxxx"},
		{"redis://admin:" + marker + "%zz@h:1/%zz", "redis://admin:xxxxx@h:1/%zz"},
		{"redis://h/0#" + marker, "redis://h/0#xxxxx"},
		{"mem://name?ttl=5s", "mem://name?ttl=5s"},
		{"etcds://u:p%40ss" + marker + "@h:2379", "etcds://u:xxxxx@h:2379"},
	} {
		got := lock.RedactURL(tc.in)
		if got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, marker) {
			t.Errorf("RedactURL(%q) = %q shows the secret", tc.in, got)
		}
		if has := lock.URLHasSecrets(tc.in); has != (got != tc.in) {
			t.Errorf("URLHasSecrets(%q) = %v, but RedactURL changed it: %v", tc.in, has, got != tc.in)
		}
	}
}

// TestOpenErrorsHideSecrets: whatever is wrong with a URL, Open's error
// names it without the URL's secrets.
func TestOpenErrorsHideSecrets(t *testing.T) {
	for _, raw := range []string{
		"//admin:" + marker + "@127.0.0.1:18050",
		"admin:" + marker + "@127.0.0.1:18050",
		"nosuch://admin:" + marker + "@h",
		"mem://admin:" + marker + "@h:%zz",
		"mem://x?password=" + marker,
		"mem://x?ttl=5s;password=" + marker,
		"mem://x?%zz=" + marker,
		"mem://x?password",
		"mem://x?password=" + marker + "%zz",
		"mem://x?password=" + marker + "&password=" + marker,
		"mem://x#" + marker,
		"mem://x?&",
	} {
		_, err := lock.Open(context.Background(), raw)
		if err == nil {
			t.Errorf("Open(%q) = nil error", raw)
			continue
		}
		if !errors.Is(err, lock.ErrInvalid) && !errors.Is(err, lock.ErrUnknownScheme) {
			t.Errorf("Open(%q) = %v, want ErrInvalid or ErrUnknownScheme", raw, err)
		}
		if strings.Contains(err.Error(), marker) {
			t.Errorf("Open(%q) error shows the secret: %v", raw, err)
		}
		t.Logf("%s", err)
	}
}

// TestOpenQueryIsStrict: a malformed or repeated parameter is an error
// naming it, never dropped.
func TestOpenQueryIsStrict(t *testing.T) {
	for raw, want := range map[string]string{
		"mem://x?ttl=5s;drift=1ms":   `"ttl"`,
		"mem://x?%zz":                "bad escape",
		"mem://x?ttl=5s&ttl=6s":      `"ttl" given more than once`,
		"mem://x?ttl":                `"ttl" has no value`,
		"mem://x?ttl=5s&&drift=1ms":  "parameter 2 is empty",
		"mem://x?ttl=5%zz":           `"ttl": its value has a bad escape`,
		"mem://x?tll=5s":             `unknown query parameter "tll"`,
		"mem://x?autorenew=yes":      "autorenew",
		"mem://x?ttl=2562047h47m16s": "ttl",
		"mem://x?drift=-1s":          "drift",
	} {
		_, err := lock.Open(context.Background(), raw)
		if !errors.Is(err, lock.ErrInvalidOption) && !errors.Is(err, lock.ErrInvalidTTL) {
			t.Errorf("Open(%q) = %v, want ErrInvalidOption or ErrInvalidTTL", raw, err)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want it to say %s", raw, err, want)
		}
	}
}
