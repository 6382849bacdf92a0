module github.com/distlock/lock

go 1.26

require (
	github.com/anishathalye/porcupine v1.3.1
	go.uber.org/goleak v1.3.0
)

require github.com/stretchr/testify v1.12.1 // indirect
