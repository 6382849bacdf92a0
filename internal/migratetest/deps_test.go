package migratetest

import (
	_ "github.com/anishathalye/porcupine"
	_ "github.com/distlock/lock/etcd"
	_ "github.com/distlock/lock/internal/redistest"
	_ "github.com/distlock/lock/internal/sqltest/pgtest"
	_ "github.com/distlock/lock/migrate"
	_ "github.com/distlock/lock/redis"
)
