module github.com/distlock/lock/internal/simredis

go 1.26.0

replace github.com/distlock/lock => ../..

replace github.com/distlock/lock/redis => ../../redis

replace github.com/distlock/lock/internal/redistest => ../redistest

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/distlock/lock v0.0.0-00010101000000-000000000000
	github.com/distlock/lock/redis v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
