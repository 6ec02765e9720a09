package llamacpp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// WorkerBinary is the name of the worker executable that `make llamacpp`
// builds next to bin/dpnode.
const WorkerBinary = "dpnode-llama-worker"

// WorkerEnv names the environment variable that points at the worker
// executable, for a dpnode that is not next to it (go run).
const WorkerEnv = "DPNODE_LLAMACPP_WORKER"

// WorkerRoleEnv names the environment variable that says what a worker
// is for (rank-3, tokenizer), so that ps and /proc tell workers apart.
const WorkerRoleEnv = "DPNODE_WORKER"

// ErrNotInstalled is returned when the llama.cpp engine is asked for on a
// machine that does not have it.
var ErrNotInstalled = errors.New("llamacpp: the llama.cpp engine is not installed")

// FindWorker returns the worker executable: $DPNODE_LLAMACPP_WORKER, else
// dpnode-llama-worker next to the running executable, else in ./bin.
func FindWorker() (string, error) {
	if p := os.Getenv(WorkerEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrNotInstalled, WorkerEnv, p, err)
		}
		return p, nil
	}
	var tried []string
	if exe, err := os.Executable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), WorkerBinary))
	}
	tried = append(tried, filepath.Join("bin", WorkerBinary))
	for _, p := range tried {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return filepath.Abs(p)
		}
	}
	return "", fmt.Errorf("%w (looked for %s): run `make llamacpp` in the dpnode source tree, which installs llama.cpp's libraries and builds bin/%s next to bin/dpnode, or point %s at the worker",
		ErrNotInstalled, strings.Join(tried, " and "), WorkerBinary, WorkerEnv)
}

// WorkerConfig starts a worker process.
type WorkerConfig struct {
	// Binary is the worker executable (FindWorker).
	Binary string
	// Env is added to the worker's environment: CUDA_VISIBLE_DEVICES
	// names its GPU.
	Env []string
	// Logger receives the worker's log lines (llama.cpp's, at debug).
	Logger *slog.Logger
}

// Worker is a running worker process and the socket to it.
//
// Concurrency: Call is safe for concurrent use; replies are matched to
// calls by id.
type Worker struct {
	cmd  *exec.Cmd
	conn net.Conn
	log  *slog.Logger

	writeMu sync.Mutex
	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan *dpnodev1.WorkerReply
	// tail keeps the worker's last log lines, which say why it died.
	tail []string

	exited  chan struct{}
	waitErr error
	done    chan struct{}
	err     error
	closing sync.Once
}

// StartWorker starts a worker and loads its model. It returns when the
// model is loaded, or with an error that says why it could not be (the
// worker's own words, and its last log lines), or when ctx is done.
func StartWorker(ctx context.Context, cfg WorkerConfig, load *dpnodev1.LoadModel) (*Worker, *dpnodev1.ModelReady, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("llamacpp: a socket pair for the worker: %w", err)
	}
	parent := os.NewFile(uintptr(fds[0]), "worker-socket")
	child := os.NewFile(uintptr(fds[1]), "worker-socket")
	conn, err := net.FileConn(parent)
	parent.Close()
	if err != nil {
		child.Close()
		return nil, nil, fmt.Errorf("llamacpp: the worker's socket: %w", err)
	}
	cmd := exec.Command(cfg.Binary)
	cmd.Env = append(os.Environ(), cfg.Env...)
	// The worker's socket is its fd 3.
	cmd.ExtraFiles = []*os.File{child}
	// Its own process group, so that a terminal's signals go to dpnode,
	// which stops its workers itself; and it dies with dpnode.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		conn.Close()
		child.Close()
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		conn.Close()
		child.Close()
		return nil, nil, fmt.Errorf("llamacpp: starting the worker %s: %w", cfg.Binary, err)
	}
	child.Close()
	w := &Worker{cmd: cmd, conn: conn, log: cfg.Logger, pending: map[uint64]chan *dpnodev1.WorkerReply{},
		exited: make(chan struct{}), done: make(chan struct{})}
	logged := make(chan struct{})
	go w.readLog(stderr, logged)
	go func() {
		<-logged
		w.waitErr = cmd.Wait()
		close(w.exited)
	}()
	go w.readReplies()

	rep, err := w.Call(ctx, &dpnodev1.WorkerRequest{Body: &dpnodev1.WorkerRequest_Load{Load: load}})
	if err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("llamacpp: loading %s: %w", load.Path, err)
	}
	ready := rep.GetReady()
	if ready == nil {
		w.Close()
		return nil, nil, fmt.Errorf("llamacpp: loading %s: the worker answered %T", load.Path, rep.Body)
	}
	return w, ready, nil
}

// loadProgress starts the worker's lines that say how far its model's load
// is, in percent; offloaded is llama.cpp's line that says how many layers
// went to the GPU.
const loadProgress = "dpnode-load-progress "

var offloaded = regexp.MustCompile(`offloaded (\d+)/(\d+) layers to GPU`)

// maxTail is how many of the worker's last log lines an error quotes.
const maxTail = 8

func (w *Worker) readLog(r io.Reader, done chan struct{}) {
	defer close(done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if pct, ok := strings.CutPrefix(line, loadProgress); ok {
			w.log.Info("loading the model", "progress", pct+"%")
			continue
		}
		if m := offloaded.FindStringSubmatch(line); m != nil {
			w.log.Info("layers offloaded to the GPU", "layers", m[1], "of", m[2])
		}
		w.log.Debug(line, "source", "llama.cpp")
		w.mu.Lock()
		w.tail = append(w.tail, line)
		if len(w.tail) > maxTail {
			w.tail = w.tail[1:]
		}
		w.mu.Unlock()
	}
}

func (w *Worker) readReplies() {
	var err error
	for {
		rep := &dpnodev1.WorkerReply{}
		if err = ReadFrame(w.conn, rep); err != nil {
			break
		}
		w.mu.Lock()
		ch := w.pending[rep.Id]
		delete(w.pending, rep.Id)
		w.mu.Unlock()
		if ch != nil {
			ch <- rep
		}
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		// A worker that speaks nonsense is as good as dead.
		w.kill()
	}
	select {
	case <-w.exited:
	case <-time.After(5 * time.Second):
		w.kill()
		<-w.exited
	}
	w.mu.Lock()
	w.err = w.describeExit()
	// Done first: a call that finds its reply channel closed must find the
	// worker done too, or a caller that retries on a dead worker (the
	// tokenizer) sees a failure it cannot tell from any other.
	close(w.done)
	for id, ch := range w.pending {
		close(ch)
		delete(w.pending, id)
	}
	w.mu.Unlock()
}

// describeExit says how the worker ended; w.mu is held.
func (w *Worker) describeExit() error {
	status := "it exited"
	if w.waitErr != nil {
		status = w.waitErr.Error()
	}
	msg := fmt.Sprintf("the model worker (pid %d) is gone: %s", w.cmd.Process.Pid, status)
	if len(w.tail) > 0 {
		msg += "; its last words: " + strings.Join(w.tail, " | ")
	}
	return errors.New(msg)
}

func (w *Worker) kill() {
	// The whole group: the worker and anything it started.
	_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
}

// ReplyError is a WorkerError reply: the worker answered, and refused the
// request (a grammar llama.cpp cannot parse), as distinct from a worker
// that could not be reached.
type ReplyError struct{ Message string }

func (e *ReplyError) Error() string { return e.Message }

// Call sends req and waits for its reply. A WorkerError reply is returned
// as a *ReplyError.
func (w *Worker) Call(ctx context.Context, req *dpnodev1.WorkerRequest) (*dpnodev1.WorkerReply, error) {
	ch := make(chan *dpnodev1.WorkerReply, 1)
	w.mu.Lock()
	select {
	case <-w.done:
		err := w.err
		w.mu.Unlock()
		return nil, err
	default:
	}
	w.nextID++
	req.Id = w.nextID
	w.pending[req.Id] = ch
	w.mu.Unlock()

	w.writeMu.Lock()
	err := WriteFrame(w.conn, req)
	w.writeMu.Unlock()
	if err != nil {
		w.forget(req.Id)
		select {
		case <-w.done:
			return nil, w.Err()
		case <-time.After(time.Second):
			return nil, fmt.Errorf("llamacpp: writing to the model worker: %w", err)
		}
	}
	select {
	case rep, ok := <-ch:
		if !ok {
			return nil, w.Err()
		}
		if e := rep.GetError(); e != nil {
			return nil, &ReplyError{Message: e.Message}
		}
		return rep, nil
	case <-ctx.Done():
		w.forget(req.Id)
		return nil, ctx.Err()
	}
}

func (w *Worker) forget(id uint64) {
	w.mu.Lock()
	delete(w.pending, id)
	w.mu.Unlock()
}

// Done is closed when the worker has exited.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Err says why the worker exited, once Done is closed.
func (w *Worker) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Pid is the worker's process id.
func (w *Worker) Pid() int { return w.cmd.Process.Pid }

// closeGrace is how long Close lets the worker exit on its own, which an
// idle one does at once, before it kills it.
const closeGrace = 200 * time.Millisecond

// Close stops the worker and waits until it is gone. Hanging up is the
// worker's signal to exit; one that does not within closeGrace (it is in
// the middle of a step) is killed: it holds no state worth saving, since
// its requests move elsewhere.
func (w *Worker) Close() error {
	w.closing.Do(func() { w.conn.Close() })
	select {
	case <-w.done:
	case <-time.After(closeGrace):
		w.kill()
		<-w.done
	}
	return nil
}
