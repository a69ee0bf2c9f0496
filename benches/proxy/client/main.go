// Command client is the closed-loop load generator of scripts/proxy-bench: -c workers,
// each sending its next chat request as soon as its last one ended, for -duration (or
// until -requests), after -warmup. It prints one JSON object:
//
//	ttft_ms  time to the first content delta (streams)     p50, p90, p99, max
//	e2e_ms   time to the last byte of the answer           p50, p90, p99, max
//	gap_ms   every gap between two content deltas          p50, p99, max
//	frames   content deltas expected and received; lost = expected - received
//	overhead_ms  the gateway's own figure of its share, where it reports one: the
//	         Server-Timing header's `overhead;dur=X` or `timings.overhead_ms` in the body
//	         (or in the last stream chunk that carries `timings`)
//	cpu_ms_per_request, peak_rss_mib  of -watch-pid and its descendants (/proc), over
//	         the measured window
//
// Workers start spread over -ramp, so that with answers of equal length their requests do
// not all arrive in the same millisecond, round after round.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

type options struct {
	url, model, key string
	stream          bool
	deltas          int
}

// result is one request's outcome, as measured.
type result struct {
	start     time.Time
	end       time.Time
	ttft, e2e float64 // ms
	gaps      []float64
	frames    int
	overhead  float64 // ms; < 0 when the gateway reported none
	err       string
}

func main() {
	var o options
	flag.StringVar(&o.url, "url", "http://127.0.0.1:8000/v1", "base URL; /chat/completions is appended")
	flag.StringVar(&o.model, "model", "mock", "model to ask for")
	flag.StringVar(&o.key, "key", "", "sent as Authorization: Bearer")
	flag.BoolVar(&o.stream, "stream", false, "stream the answers")
	flag.IntVar(&o.deltas, "deltas", 64, "content deltas an answer should have (max_tokens)")
	conc := flag.Int("c", 1, "concurrent workers")
	duration := flag.Duration("duration", 5*time.Second, "measured time")
	warmup := flag.Duration("warmup", time.Second, "time before measuring starts")
	ramp := flag.Duration("ramp", 0, "workers start spread over this time (within the warm-up)")
	requests := flag.Int("requests", 0, "stop after this many measured requests (0: -duration)")
	drain := flag.Duration("drain", 60*time.Second, "longest wait for requests in flight at the end")
	think := flag.Duration("think", 0, "pause between a worker's answer and its next request")
	watch := flag.Int("watch-pid", 0, "process whose CPU and RSS (with its descendants) to report")
	label := flag.String("label", "", "copied into the output")
	flag.Parse()
	debug.SetGCPercent(400)

	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns:        *conc * 2,
		MaxIdleConnsPerHost: *conc * 2,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}}
	body := requestBody(o)

	begin := time.Now()
	measureFrom := begin.Add(*warmup)
	deadline := measureFrom.Add(*duration)
	var (
		mu      sync.Mutex
		results []result
		counted int
		// openMeasured is the measured requests sent and not yet answered.
		openMeasured int
		done         = make(chan struct{})
		once         sync.Once
	)
	stop := func() { once.Do(func() { close(done) }) }
	stopped := func() bool {
		select {
		case <-done:
			return true
		default:
			return time.Now().After(deadline)
		}
	}

	var completedInWindow int
	watcher := newWatcher(*watch)
	stopWatch := watcher.sampleRSS(50 * time.Millisecond)

	var wg sync.WaitGroup
	for w := 0; w < *conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			if *ramp > 0 {
				time.Sleep(*ramp * time.Duration(w) / time.Duration(*conc))
			}
			for !stopped() {
				mu.Lock()
				measured := time.Now().After(measureFrom)
				if measured {
					openMeasured++
				}
				mu.Unlock()
				r := o.do(client, body)
				mu.Lock()
				if measured {
					openMeasured--
				}
				if r.end.After(measureFrom) && !r.end.After(deadline) {
					completedInWindow++
				}
				if measured {
					results = append(results, r)
					counted++
					if *requests > 0 && counted >= *requests {
						stop()
					}
				}
				mu.Unlock()
				if *think > 0 {
					time.Sleep(*think)
				}
			}
		}(w)
	}
	// CPU over the measured window: from the end of the warm-up to the deadline, not
	// the drain after it.
	time.Sleep(time.Until(measureFrom))
	cpu0 := watcher.cpu()
	time.Sleep(time.Until(deadline))
	cpu1 := watcher.cpu()
	cpu := cpuSecondsBetween(cpu0, cpu1)
	windowEnd := time.Now()
	// Requests still open after -drain are counted as errors, not waited for.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(*drain):
	}
	peakRSS := stopWatch()
	mu.Lock()
	unfinished := openMeasured
	out := summarise(o, results, *conc)
	mu.Unlock()
	if unfinished > 0 {
		out["errors"] = out["errors"].(int) + unfinished
		out["requests"] = out["requests"].(int) + unfinished
		out["error_kinds"].(map[string]int)["unfinished after the drain"] = unfinished
	}

	out["label"] = *label
	out["wall_s"] = windowEnd.Sub(measureFrom).Seconds()
	if *watch > 0 && completedInWindow > 0 {
		out["cpu_ms_per_request"] = cpu * 1000 / float64(completedInWindow)
		out["cpu_util"] = cpu / windowEnd.Sub(measureFrom).Seconds()
		out["peak_rss_mib"] = peakRSS / 1024
	}
	out["completed_in_window"] = completedInWindow
	out["rps"] = float64(completedInWindow) / windowEnd.Sub(measureFrom).Seconds()
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	enc.Encode(out)
}

func requestBody(o options) []byte {
	req := map[string]any{
		"model":      o.model,
		"messages":   []map[string]string{{"role": "user", "content": "Say something, sixty-four words or so."}},
		"max_tokens": o.deltas,
		"stream":     o.stream,
	}
	if o.stream {
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(req)
	return b
}

// chunk is what the client reads of an answer, streamed or not.
type chunk struct {
	Choices []struct {
		Delta        struct{ Content string } `json:"delta"`
		Message      struct{ Content string } `json:"message"`
		FinishReason *string                  `json:"finish_reason"`
	} `json:"choices"`
	Timings map[string]any `json:"timings"`
}

func (o options) do(client *http.Client, body []byte) result {
	return o.doAt(client, o.url+"/chat/completions", body)
}

// doAt sends one chat request to url and measures it.
func (o options) doAt(client *http.Client, url string, body []byte) (r result) {
	r.overhead = -1
	r.start = time.Now()
	defer func() { r.end = time.Now(); r.e2e = ms(r.end.Sub(r.start)) }()
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if o.key != "" {
		req.Header.Set("Authorization", "Bearer "+o.key)
	}
	resp, err := client.Do(req)
	if err != nil {
		r.err = "connect: " + short(err.Error())
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		r.err = fmt.Sprintf("status %d: %s", resp.StatusCode, short(string(b)))
		return
	}
	r.overhead = serverTiming(resp.Header.Get("Server-Timing"))
	if !o.stream {
		b, err := io.ReadAll(resp.Body)
		var c chunk
		if err == nil {
			err = json.Unmarshal(b, &c)
		}
		switch {
		case err != nil:
			r.err = "body: " + short(err.Error())
		case len(c.Choices) == 0 || c.Choices[0].Message.Content == "":
			r.err = "answer without content"
		}
		if v, ok := c.Timings["overhead_ms"].(float64); ok {
			r.overhead = v
		}
		return
	}
	rd := bufio.NewReaderSize(resp.Body, 16<<10)
	var last time.Time
	finished, sawDone := false, false
	for {
		line, err := rd.ReadSlice('\n')
		now := time.Now()
		if len(line) > 0 {
			data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
			data = bytes.TrimSpace(data)
			switch {
			case !ok || len(data) == 0:
			case string(data) == "[DONE]":
				sawDone = true
			default:
				var c chunk
				if json.Unmarshal(data, &c) != nil {
					r.err = "frame is not JSON: " + short(string(data))
					return
				}
				for _, ch := range c.Choices {
					if ch.Delta.Content != "" {
						if r.frames == 0 {
							r.ttft = ms(now.Sub(r.start))
						} else {
							r.gaps = append(r.gaps, ms(now.Sub(last)))
						}
						last = now
						r.frames++
					}
					if ch.FinishReason != nil && *ch.FinishReason != "" {
						finished = true
					}
				}
				if v, ok := c.Timings["overhead_ms"].(float64); ok {
					r.overhead = v
				}
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err != io.EOF {
				r.err = "read: " + short(err.Error())
			}
			break
		}
	}
	if r.err == "" && (!finished || !sawDone) {
		r.err = "stream ended without finish_reason or [DONE]"
	}
	return
}

// serverTiming reads `overhead;dur=X` from a Server-Timing header; -1 without one.
func serverTiming(h string) float64 {
	for _, metric := range strings.Split(h, ",") {
		parts := strings.Split(strings.TrimSpace(metric), ";")
		if parts[0] != "overhead" {
			continue
		}
		for _, p := range parts[1:] {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
				if f, err := strconv.ParseFloat(v, 64); err == nil {
					return f
				}
			}
		}
	}
	return -1
}

func summarise(o options, rs []result, conc int) map[string]any {
	var ttft, e2e, gaps, overhead []float64
	errs := map[string]int{}
	nerr, frames, expected := 0, 0, 0
	for _, r := range rs {
		if r.err != "" {
			nerr++
			errs[r.err]++
			continue
		}
		e2e = append(e2e, r.e2e)
		if r.overhead >= 0 {
			overhead = append(overhead, r.overhead)
		}
		if o.stream {
			ttft = append(ttft, r.ttft)
			gaps = append(gaps, r.gaps...)
			frames += r.frames
			expected += o.deltas
		}
	}
	out := map[string]any{
		"concurrency": conc, "stream": o.stream, "requests": len(rs), "ok": len(rs) - nerr,
		"errors": nerr, "error_kinds": errs,
		"e2e_ms": stats(e2e, 50, 90, 99, 100),
	}
	if o.stream {
		out["ttft_ms"] = stats(ttft, 50, 90, 99, 100)
		out["gap_ms"] = stats(gaps, 50, 99, 100)
		out["frames_expected"] = expected
		out["frames_received"] = frames
		out["lost_frames"] = expected - frames
	}
	if len(overhead) > 0 {
		out["overhead_ms"] = stats(overhead, 50, 99)
	}
	return out
}

// stats gives the nearest-rank percentiles of xs, keyed "p50", "p99", "max" (100), and n.
func stats(xs []float64, ps ...float64) map[string]float64 {
	if len(xs) == 0 {
		return nil
	}
	sort.Float64s(xs)
	out := map[string]float64{"n": float64(len(xs))}
	for _, p := range ps {
		i := int(p/100*float64(len(xs))+0.999999) - 1
		i = max(0, min(i, len(xs)-1))
		key := "p" + strconv.FormatFloat(p, 'f', -1, 64)
		if p == 100 {
			key = "max"
		}
		out[key] = xs[i]
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func short(s string) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " ")
	if len(s) > 160 {
		s = s[:160]
	}
	return s
}
