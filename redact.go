package lock

import (
	"net/url"
	"slices"
	"strings"
)

// Redaction: the one rule for showing a backend URL to a person.
//
// A backend URL can carry secrets in three places: the userinfo
// (user:password@, or a bare password or token before the @), the value of
// a query parameter that holds a password or a token, and, when the URL
// has no "//" after its scheme (or no scheme at all), an opaque part in
// which nothing can be told apart. Every message of this module that shows
// a URL shows RedactURL's form of it, and every message about a URL that
// is built from other errors (url.Parse's, a backend's) is passed through
// RedactText, which cuts out each secret value that RedactURL found, wherever it
// appears. The rule works on the raw text, not on url.Parse's result, so
// that it holds for the URLs url.Parse refuses (a bad escape, a bad port):
// those are the ones whose errors get printed.

// redacted replaces a secret in RedactURL's output.
const redacted = "xxxxx"

// secretWords mark a query parameter as secret by name, on every scheme,
// whatever the backend declared: a parameter whose name contains one of
// them (case-insensitively) never has its value shown. The list errs on
// the side of hiding (a "passphrase_file" path is hidden too).
var secretWords = []string{"pass", "token", "secret", "auth", "credential"}

// RedactURL returns rawURL fit to show: the userinfo's password (or the
// whole userinfo, when it has no ':'), the value of every query parameter
// that carries a secret, the fragment, and the opaque part of a URL
// without "//" after its scheme are replaced by "xxxxx". A parameter
// carries a secret when a registered scheme declared it so (Scheme.Secrets)
// or its name contains pass, token, secret, auth or credential. RedactURL
// accepts any string, including ones url.Parse refuses; a string that is
// not a URL at all comes back as "xxxxx".
//
// The declared secrets are those of the schemes registered in the default
// URLMux: for a URL that a URLMux of one's own opens, use its RedactURL
// method.
func RedactURL(rawURL string) string { return defaultMux.RedactURL(rawURL) }

// RedactURL is the package-level RedactURL, with the secrets declared by
// the schemes registered in m.
func (m *URLMux) RedactURL(rawURL string) string {
	shown, _, _ := m.redact(rawURL)
	return shown
}

// redact returns RedactURL's form of raw, the secret values it cut out
// (decoded and as written), for RedactText, and whether it hid anything
// (an empty password too), for URLHasSecrets.
func (m *URLMux) redact(raw string) (string, []string, bool) {
	var secrets []string
	hid := false
	hide := func(s string) string {
		hid = true
		if s == "" {
			return ""
		}
		secrets = append(secrets, s)
		if d, err := url.PathUnescape(s); err == nil && d != s {
			secrets = append(secrets, d)
		}
		if d, err := url.QueryUnescape(s); err == nil && d != s {
			secrets = append(secrets, d)
		}
		return redacted
	}
	rest := raw
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		hide(rest[i+1:])
		shown, inner, _ := m.redact(rest[:i])
		return shown + "#" + redacted, append(secrets, inner...), true
	}
	var b strings.Builder
	scheme, afterScheme, hasScheme := cutScheme(rest)
	switch {
	case hasScheme && strings.HasPrefix(afterScheme, "//"):
		b.WriteString(scheme + "://")
		rest = afterScheme[2:]
	case !hasScheme && strings.HasPrefix(rest, "//"):
		b.WriteString("//")
		rest = rest[2:]
	case hasScheme:
		// scheme:opaque, such as "user:password@host" read as scheme
		// "user": nothing in it can be told apart from a secret.
		b.WriteString(scheme + ":")
		b.WriteString(hide(afterScheme))
		return b.String(), secrets, hid
	default:
		// A relative reference or no URL at all: a bare password, a
		// path, anything.
		b.WriteString(hide(rest))
		if rest == "" {
			b.WriteString(redacted)
		}
		return b.String(), secrets, hid
	}
	authority, pathQuery := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, pathQuery = rest[:i], rest[i:]
	}
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		userinfo := authority[:at]
		if user, pass, ok := strings.Cut(userinfo, ":"); ok {
			b.WriteString(user + ":" + hide(pass))
			if pass == "" {
				b.WriteString(redacted)
			}
		} else {
			b.WriteString(hide(userinfo))
		}
		b.WriteString(authority[at:])
	} else {
		b.WriteString(authority)
	}
	path, query, hasQuery := strings.Cut(pathQuery, "?")
	b.WriteString(path)
	if hasQuery {
		b.WriteString("?" + m.redactQuery(query, scheme, hide))
	}
	return b.String(), secrets, hid
}

// cutScheme splits raw at the ':' that ends a URL scheme (a letter, then
// letters, digits, '+', '-' or '.').
func cutScheme(raw string) (scheme, rest string, ok bool) {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		case i > 0 && c == ':':
			return raw[:i], raw[i+1:], true
		default:
			return "", raw, false
		}
	}
	return "", raw, false
}

// redactQuery hides the values of the secret parameters in query, split at
// '&' and ';' (a query Open refuses may still be printed) and rebuilt with
// the same separators.
func (m *URLMux) redactQuery(query, scheme string, hide func(string) string) string {
	var b strings.Builder
	for query != "" {
		part := query
		sep := ""
		if i := strings.IndexAny(query, "&;"); i >= 0 {
			part, sep, query = query[:i], query[i:i+1], query[i+1:]
		} else {
			query = ""
		}
		b.WriteString(m.redactParam(part, scheme, hide) + sep)
	}
	return b.String()
}

// redactParam hides the value of one name=value pair when it is secret. A
// pair whose name does not decode is hidden whole: nothing says it is not
// a secret.
func (m *URLMux) redactParam(part, scheme string, hide func(string) string) string {
	if part == "" {
		return ""
	}
	rawName, value, hasValue := strings.Cut(part, "=")
	name, err := url.QueryUnescape(rawName)
	if err != nil {
		return hide(part)
	}
	if hasValue && m.isURLParam(scheme, name) {
		return rawName + "=" + m.redactNested(value, hide)
	}
	if !hasValue || !m.isSecretParam(scheme, name) {
		return part
	}
	return rawName + "=" + hide(value) + emptyMark(value)
}

// redactNested redacts value, a query parameter's value that holds a
// backend URL (Scheme.URLs), by the rule of the outer URL, recursively.
// A value that does not decode is hidden whole. The outer text may hold
// each inner secret escaped for a query, so hide learns those forms too.
// The shown value escapes only what would end or change it in a query.
func (m *URLMux) redactNested(value string, hide func(string) string) string {
	inner, err := url.QueryUnescape(value)
	if err != nil {
		return hide(value) + emptyMark(value)
	}
	shown, secrets, innerHid := m.redact(inner)
	if innerHid {
		hide("") // the outer URL hides something too
	}
	for _, sec := range secrets {
		hide(sec)
		if e := url.QueryEscape(sec); e != sec {
			hide(e)
		}
	}
	return nestedEscaper.Replace(shown)
}

// nestedEscaper escapes a shown inner URL for the outer query: '%' (so
// that the inner URL's own escapes stay as written), the separators '&'
// and ';', '#', '+' and the space.
var nestedEscaper = strings.NewReplacer("%", "%25", "&", "%26", ";", "%3B", "#", "%23", "+", "%2B", " ", "%20")

// isURLParam reports whether query parameter name holds a backend URL on
// scheme, as registered in m (Scheme.URLs).
func (m *URLMux) isURLParam(scheme, name string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Contains(m.schemes[scheme].URLs, name)
}

// emptyMark keeps an empty secret value visibly hidden.
func emptyMark(value string) string {
	if value == "" {
		return redacted
	}
	return ""
}

// isSecretParam reports whether query parameter name carries a secret on
// scheme, as registered in m.
func (m *URLMux) isSecretParam(scheme, name string) bool {
	lower := strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(lower, w) {
			return true
		}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Contains(m.schemes[scheme].Secrets, name)
}

// minScrubbed is the shortest secret RedactText cuts out of free text. A
// shorter one (a 2-character password) would cut letters out of every
// word of the message; such a secret is redacted only where the URL is
// shown, by RedactURL.
const minScrubbed = 3

// RedactText returns text with every secret of rawURL that it contains
// (each part RedactURL hides, as written and unescaped, of 3 bytes or
// more) replaced by "xxxxx": for messages built from errors about rawURL
// (url.Parse's, a backend's, a store's), which may quote any part of it.
// lock.Open applies it to its errors; tools apply it to every later error
// they print about the backend. Like RedactURL, it knows the secrets
// declared in the default URLMux; a URLMux's RedactText method knows its
// own.
func RedactText(text, rawURL string) string { return defaultMux.RedactText(text, rawURL) }

// RedactText is the package-level RedactText, with the secrets declared by
// the schemes registered in m.
func (m *URLMux) RedactText(text, rawURL string) string {
	_, secrets, _ := m.redact(rawURL)
	for _, s := range secrets {
		if len(s) >= minScrubbed {
			text = strings.ReplaceAll(text, s, redacted)
		}
	}
	return text
}

// URLHasSecrets reports whether rawURL carries something RedactURL hides:
// a userinfo, a secret parameter, a fragment, or an opaque part. Tools use
// it to warn when such a URL was given where other users can read it (a
// command line). It knows the secrets declared in the default URLMux.
func URLHasSecrets(rawURL string) bool { return defaultMux.URLHasSecrets(rawURL) }

// URLHasSecrets is the package-level URLHasSecrets, with the secrets
// declared by the schemes registered in m.
func (m *URLMux) URLHasSecrets(rawURL string) bool {
	_, _, hid := m.redact(rawURL)
	return hid
}
