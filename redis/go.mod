module github.com/distlock/lock/redis

go 1.26.0

require (
	github.com/distlock/lock v0.0.0-00010101000000-000000000000
	github.com/distlock/lock/internal/redistest v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace github.com/distlock/lock => ../

replace github.com/distlock/lock/internal/redistest => ../internal/redistest
