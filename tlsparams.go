package lock

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"strconv"
)

// TLSParams are the query parameters that configure TLS, named alike on
// every scheme that speaks it (rediss, rediss+cluster, rediss+sentinel,
// redlocks, etcds, consuls):
//
//	ca_file      PEM file of the CAs to trust instead of the system's
//	cert_file    PEM file of a client certificate (with key_file)
//	key_file     PEM file of the client certificate's key (with cert_file)
//	server_name  the name the server's certificate must carry, when it is
//	             not the host of the URL (an IP address, a tunnel)
//	skip_verify  true: accept any certificate, so anyone on the path can
//	             read and change the traffic; for tests only
//
// A backend's Opener adds them to its Params and calls TLSConfig.
var TLSParams = []string{"ca_file", "cert_file", "key_file", "server_name", "skip_verify"}

// TLSConfig returns the TLS configuration that the TLSParams in q ask for,
// for a scheme that speaks TLS (on is true), or nil, nil for one that does
// not and was given none of them. The configuration verifies the server's
// certificate against ca_file's CAs (else the system's) and server_name
// (else the host dialled), presents cert_file and key_file when given, and
// speaks TLS 1.2 or later. Errors wrap ErrInvalid and name the parameter:
// a TLS parameter on a scheme without TLS (tlsScheme names the one to use
// instead), a file that cannot be read or holds no PEM certificate or key,
// cert_file without key_file or the other way, a skip_verify that is not a
// boolean, and skip_verify=true with ca_file or server_name, which it would
// silently override.
func TLSConfig(q url.Values, on bool, tlsScheme string) (*tls.Config, error) {
	if !on {
		for _, p := range TLSParams {
			if q.Has(p) {
				return nil, invalid(ErrInvalidOption, "query parameter %s configures TLS, which this scheme does not speak; use %s://", p, tlsScheme)
			}
		}
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: q.Get("server_name")}
	if f := q.Get("ca_file"); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, invalid(ErrInvalidOption, "ca_file: %v", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, invalid(ErrInvalidOption, "ca_file %s holds no PEM certificate", f)
		}
	}
	certFile, keyFile := q.Get("cert_file"), q.Get("key_file")
	switch {
	case certFile != "" && keyFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, invalid(ErrInvalidOption, "cert_file and key_file: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case certFile != "":
		return nil, invalid(ErrInvalidOption, "cert_file needs key_file, the file of the certificate's private key")
	case keyFile != "":
		return nil, invalid(ErrInvalidOption, "key_file needs cert_file, the file of the client certificate")
	}
	if v := q.Get("skip_verify"); v != "" {
		skip, err := strconv.ParseBool(v)
		if err != nil {
			return nil, invalid(ErrInvalidOption, "skip_verify=%q: want true or false", v)
		}
		if skip && (cfg.RootCAs != nil || cfg.ServerName != "") {
			return nil, invalid(ErrInvalidOption, "skip_verify=true turns off the checks that ca_file and server_name configure; give one or the other")
		}
		cfg.InsecureSkipVerify = skip
	}
	return cfg, nil
}

// SkipsVerify reports whether rawURL, or a backend URL inside it (a
// parameter its scheme declares in Scheme.URLs, such as the from and to of
// a migrate:// URL), asks for TLS without certificate checks
// (skip_verify=true), for tools that warn about it. It is false for a URL
// that does not parse. The schemes are those of the default URLMux.
func SkipsVerify(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return false
	}
	if skip, _ := strconv.ParseBool(q.Get("skip_verify")); skip {
		return true
	}
	s, _ := defaultMux.Scheme(u.Scheme)
	for _, p := range s.URLs {
		for _, inner := range q[p] {
			if SkipsVerify(inner) { // each level is shorter: it ends
				return true
			}
		}
	}
	return false
}
