package fence

// Resources returns how many resources g holds, for the external tests.
func Resources(g *Guard) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.resources)
}
