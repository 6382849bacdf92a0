package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

var methods sync.Map

func bump(m string) {
	v, _ := methods.LoadOrStore(m, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

type cs struct {
	grpc.ClientStream
	m string
}

func (c cs) SendMsg(x any) error { bump(c.m + " msg"); return c.ClientStream.SendMsg(x) }

func probeClient(addr string, n *atomic.Int64) *clientv3.Client {
	u := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		bump(method)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	st := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		n.Add(1)
		bump(method + " open")
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return cs{countingStream{s, n}, method}, nil
	}
	cli, _ := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(u), grpc.WithChainStreamInterceptor(st)}})
	return cli
}

func TestProbeHot(t *testing.T) {
	addr, stop := startEtcd()
	defer stop()
	n := &atomic.Int64{}
	var ls []locker
	for range 16 {
		ls = append(ls, newEtcdLock(probeClient(addr, n)))
	}
	hotSeparate(ls, n, time.Second)
	methods = sync.Map{}
	r := hotSeparate(ls, n, 3*time.Second)
	u, q := r.util, r.reqs
	secs := u / 100 * 3 / 0.001
	fmt.Printf("util %.1f%% reqs/section %.1f sections %.0f\n", u, q, secs)
	var keys []string
	methods.Range(func(k, v any) bool { keys = append(keys, k.(string)); return true })
	sort.Strings(keys)
	for _, k := range keys {
		v, _ := methods.Load(k)
		fmt.Printf("%-50s %.2f/section\n", k, float64(v.(*atomic.Int64).Load())/secs)
	}
}
