package main

// The gateway's CPU time and resident memory, read from /proc: the watched process, all
// its threads (a process's stat counts them) and its descendants (a worker a Python server
// forks), summed.

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux architecture
// that matters here, whatever the kernel's own tick rate.
const clockTicks = 100

type watcher struct{ pid int }

func newWatcher(pid int) watcher { return watcher{pid} }

// tree is the watched process and its descendants now.
func (w watcher) tree() []int {
	if w.pid <= 0 {
		return nil
	}
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(pid); len(f) > 1 {
			if ppid, err := strconv.Atoi(f[1]); err == nil {
				children[ppid] = append(children[ppid], pid)
			}
		}
	}
	out := []int{w.pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// statFields is /proc/PID/stat from its third field (state) on, the command name (which
// may hold spaces) cut off; fields 14 and 15 of proc(5) are [11] and [12] here.
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// cpuSample is the tree's CPU time read two ways: /proc/PID/stat's user + system time,
// which counts threads that have exited (and children waited for) but comes in 10 ms
// ticks, and each live thread's schedstat run time, in nanoseconds.
type cpuSample struct {
	ticks   int64
	threads map[string]int64 // "pid/tid" -> ns on a CPU
}

func (w watcher) cpu() cpuSample {
	s := cpuSample{threads: map[string]int64{}}
	for _, pid := range w.tree() {
		f := statFields(pid)
		if len(f) < 15 {
			continue
		}
		for _, k := range f[11:15] { // utime, stime, cutime, cstime
			v, _ := strconv.ParseInt(k, 10, 64)
			s.ticks += v
		}
		dir := "/proc/" + strconv.Itoa(pid) + "/task/"
		tasks, _ := os.ReadDir(dir)
		for _, t := range tasks {
			b, err := os.ReadFile(dir + t.Name() + "/schedstat")
			if err != nil {
				continue
			}
			if f := strings.Fields(string(b)); len(f) > 0 {
				ns, _ := strconv.ParseInt(f[0], 10, 64)
				s.threads[strconv.Itoa(pid)+"/"+t.Name()] = ns
			}
		}
	}
	return s
}

// cpuSecondsBetween is the CPU time the tree used from a to b: the threads' own run time,
// precise, unless the tick count says clearly more was used (by threads that ended in
// between, which schedstat no longer shows).
func cpuSecondsBetween(a, b cpuSample) float64 {
	var ns int64
	for id, v := range b.threads {
		ns += v - a.threads[id] // a thread born in between started from 0
	}
	precise := float64(ns) / 1e9
	coarse := float64(b.ticks-a.ticks) / clockTicks
	if coarse-precise > 0.02 {
		return coarse
	}
	return precise
}

func (w watcher) rssKiB(tree []int) float64 {
	var kib float64
	for _, pid := range tree {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 {
					n, _ := strconv.ParseFloat(f[0], 64)
					kib += n
				}
			}
		}
	}
	return kib
}

// sampleRSS samples the tree's RSS every period until the returned function is called,
// which gives the peak in KiB.
func (w watcher) sampleRSS(period time.Duration) func() float64 {
	if w.pid <= 0 {
		return func() float64 { return 0 }
	}
	var mu sync.Mutex
	tree := w.tree()
	peak := w.rssKiB(tree)
	quit := make(chan struct{})
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				// Walking all of /proc is the dear part; the tree seldom changes.
				if now.UnixMilli()%1000 < period.Milliseconds() {
					tree = w.tree()
				}
				v := w.rssKiB(tree)
				mu.Lock()
				peak = max(peak, v)
				mu.Unlock()
			}
		}
	}()
	return func() float64 {
		close(quit)
		mu.Lock()
		defer mu.Unlock()
		return max(peak, w.rssKiB(w.tree()))
	}
}
