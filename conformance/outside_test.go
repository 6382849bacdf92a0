package conformance

import "testing"

func TestOutsideStd(t *testing.T) {
	for stack, want := range map[string]bool{
		"goroutine 7 [running]:\nruntime.gopark(0x1)\n\t/usr/local/go/src/runtime/proc.go:1 +0x1\ncreated by net/http.(*Server).Serve in goroutine 1\n\t/usr/local/go/src/net/http/server.go:2 +0x2": false,
		"goroutine 8 [select]:\ngithub.com/redis/go-redis/v9.(*PubSub).run(0x1)\n\t/root/go/pkg/mod/github.com/redis/go-redis/v9@v9.23.0/pubsub.go:1 +0x1":                                           true,
		"goroutine 9 [chan receive]:\nmain.main()\n\t/tmp/x.go:3 +0x1\ncreated by github.com/distlock/lock.(*scheduler).fire in goroutine 3":                                                         true,
	} {
		if got := outsideStd(stack); got != want {
			t.Errorf("outsideStd(%q) = %v; want %v", stack, got, want)
		}
	}
}
