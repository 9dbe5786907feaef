// torch.distributed backend "weft": a process group whose operations are
// weft requests. One source for torch 1.13, where a backend is a
// c10d::ProcessGroup, and torch 2.x, where it is a c10d::Backend that torch
// wraps in a ProcessGroup. weft/torch.py compiles it with
// torch.utils.cpp_extension against the torch it runs with and registers
// the backend.
//
// Every operation posts a weft request and returns a Work at once; the
// request's completion callback (on weft's progress thread, or at once in
// the posting thread) finishes the Work and completes its future, which is
// what DDP waits on. Errors keep weft's code and message: the Python side
// maps each code to a RuntimeError subclass (weft/torch.py).
//
// Ctrl-C: torch's Work.wait lets go of the GIL and blocks in WorkWeft::wait,
// where Python cannot raise KeyboardInterrupt until it returns (at weft's
// deadline). The main thread's wait is registered here, as weft's Python
// package registers its blocking calls (weft/_comm.py, _Sigint): its SIGINT
// watcher calls interrupt_main_wait(), which aborts that wait's group, and
// the wait runs Python's signal handlers before it returns, so that the
// caller gets KeyboardInterrupt. Both register and decide with the GIL held,
// so that a SIGINT that came before the wait (and that Python has handled)
// aborts nothing.
#include <torch/extension.h>
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
using WeftBase = c10d::Backend;
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
using WeftBase = c10d::ProcessGroup;
#endif
#include <pybind11/chrono.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <weft.h>

namespace {

// A weft failure: its code and message, raised in Python as the
// RuntimeError subclass weft/torch.py registers for the code.
struct WeftTorchError : std::runtime_error {
    int code;
    WeftTorchError(int c, const std::string &msg)
        : std::runtime_error(msg), code(c) {}
};

std::exception_ptr weft_error(int code, const std::string &what,
                              const char *detail)
{
    // A timeout says "Timed out", which torch's tests and tooling look for
    // (weft's own message follows).
    std::string msg = what + ": " +
                      (code == WEFT_ETIMEDOUT ? "Timed out (" : "") +
                      weft_err_name(code) +
                      (code == WEFT_ETIMEDOUT ? ")" : "") + ": " +
                      (detail != nullptr && *detail ? detail
                                                    : weft_strerror(code));
    return std::make_exception_ptr(WeftTorchError(code, msg));
}

[[noreturn]] void unsupported(const std::string &msg)
{
    throw WeftTorchError(WEFT_EINVAL, "weft: " + msg);
}

// The weft dtype of a torch dtype, where weft has it (bool as uint8:
// reductions of bool map their op, see reduced()).
bool weft_dtype_of(at::ScalarType s, weft_dtype *d)
{
    switch (s) {
    case at::kBool:
    case at::kByte:
        *d = WEFT_UINT8;
        return true;
    case at::kChar:
        *d = WEFT_INT8;
        return true;
    case at::kInt:
        *d = WEFT_INT32;
        return true;
    case at::kLong:
        *d = WEFT_INT64;
        return true;
    case at::kHalf:
        *d = WEFT_FLOAT16;
        return true;
    case at::kBFloat16:
        *d = WEFT_BFLOAT16;
        return true;
    case at::kFloat:
        *d = WEFT_FLOAT32;
        return true;
    case at::kDouble:
        *d = WEFT_FLOAT64;
        return true;
    default:
        return false;
    }
}

// How a tensor's elements travel in an operation that only moves them:
// in its own weft dtype, count elements per tensor element; a dtype weft
// lacks (int16, complex, ...) as its bytes.
struct Wire {
    weft_dtype dtype;
    size_t per; // weft elements per tensor element
    size_t count(const at::Tensor &t) const
    {
        return (size_t)t.numel() * per;
    }
};

Wire moved(const at::Tensor &t)
{
    weft_dtype d;
    if (weft_dtype_of(t.scalar_type(), &d))
        return {d, 1};
    return {WEFT_UINT8, (size_t)t.element_size()};
}

// What every tensor handed to weft must be. A non-contiguous one is
// copied (WorkWeft::stage), as gloo does.
void check_tensor(const at::Tensor &t, const char *what)
{
    if (!t.defined())
        unsupported(std::string(what) + ": an undefined tensor");
    if (!t.device().is_cpu())
        unsupported(std::string(what) + ": a tensor on " + t.device().str() +
                    "; weft supports CPU tensors only");
    if (t.is_sparse())
        unsupported(std::string(what) + ": sparse tensors are not supported");
}

const at::Tensor &only(const std::vector<at::Tensor> &v, const char *what)
{
    if (v.size() != 1)
        unsupported(std::string(what) + ": expected one tensor, got " +
                    std::to_string(v.size()) + " (one CPU tensor per call)");
    check_tensor(v[0], what);
    return v[0];
}

void same_dtype(const at::Tensor &a, const at::Tensor &b, const char *what)
{
    if (a.scalar_type() != b.scalar_type())
        unsupported(std::string(what) + ": tensors of " +
                    c10::toString(a.scalar_type()) + " and " +
                    c10::toString(b.scalar_type()) +
                    "; every tensor of the call must have one dtype");
}

// An int64 option (BroadcastOptions::rootRank) as the C int weft takes: one
// out of its range is refused, where a cast would keep its low 32 bits
// (root 2**32 was root 0).
int to_c_int(int64_t v, const char *what)
{
    if (v < INT_MIN || v > INT_MAX)
        unsupported(std::string(what) + " " + std::to_string(v) +
                    " is out of the range of a C int");
    return (int)v;
}

// Copies t's bytes (in its logical order) to dst.
void bytes_out(const at::Tensor &t, void *dst)
{
    if (t.numel() == 0)
        return;
    at::Tensor c = t.contiguous();
    std::memcpy(dst, c.data_ptr(), c.nbytes());
}

// Fills t (contiguous or not) from t.nbytes() bytes at src.
void bytes_in(const at::Tensor &t, const void *src)
{
    if (t.numel() == 0)
        return;
    if (t.is_contiguous()) {
        std::memcpy(t.data_ptr(), src, t.nbytes());
        return;
    }
    at::Tensor c = at::empty(t.sizes(), t.options());
    std::memcpy(c.data_ptr(), src, c.nbytes());
    t.copy_(c);
}

// A reduction as weft runs it: its dtype, elements per tensor element, op;
// AVG sums then divides; BAND, BOR and BXOR (which weft_redop lacks) gather
// every rank's tensor and fold it here.
struct Reduced {
    Wire wire;
    weft_redop op;
    bool avg;
    bool bitwise;
    c10d::ReduceOp::RedOpType bit; // BAND, BOR or BXOR where bitwise
};

Reduced reduced(const c10d::ReduceOp &r, const at::Tensor &t,
                const char *what)
{
    at::ScalarType s = t.scalar_type();
    auto refuse = [&](const std::string &why) {
        unsupported(std::string(what) + ": " + why);
    };
    c10d::ReduceOp::RedOpType o = r;
    bool isint = at::isIntegralType(s, /*includeBool=*/true);
    if (o == c10d::ReduceOp::BAND || o == c10d::ReduceOp::BOR ||
        o == c10d::ReduceOp::BXOR) {
        if (!isint)
            refuse(std::string("a bitwise reduction of ") +
                   c10::toString(s) + "; BAND, BOR and BXOR need an "
                   "integer or bool dtype");
        if (s == at::kBool && o != c10d::ReduceOp::BXOR)
            return {moved(t), o == c10d::ReduceOp::BAND ? WEFT_MIN : WEFT_MAX,
                    false, false, o};
        return {moved(t), WEFT_SUM, false, true, o};
    }
    weft_redop op;
    bool avg = false;
    if (o == c10d::ReduceOp::SUM)
        op = WEFT_SUM;
    else if (o == c10d::ReduceOp::PRODUCT)
        op = WEFT_PROD;
    else if (o == c10d::ReduceOp::MIN)
        op = WEFT_MIN;
    else if (o == c10d::ReduceOp::MAX)
        op = WEFT_MAX;
    else if (o == c10d::ReduceOp::AVG) {
        if (!at::isFloatingType(s) && !at::isComplexType(s))
            refuse(std::string("AVG of ") + c10::toString(s) +
                   "; AVG needs a floating dtype");
        op = WEFT_SUM;
        avg = true;
    } else {
        refuse("this reduction is not supported; use SUM, PRODUCT, MIN, "
               "MAX, AVG, BAND, BOR or BXOR");
    }
    if (s == at::kBool) {
        if (avg)
            refuse("AVG of Bool");
        // gloo's bool arithmetic: a sum is an OR, a product an AND.
        if (op == WEFT_SUM)
            op = WEFT_MAX;
        else if (op == WEFT_PROD)
            op = WEFT_MIN;
        return {{WEFT_UINT8, 1}, op, false, false, o};
    }
    if (at::isComplexType(s)) {
        // A complex sum is the sum of its real and imaginary parts.
        if (op != WEFT_SUM)
            refuse(std::string("only SUM and AVG of ") + c10::toString(s));
        return {{s == at::kComplexFloat ? WEFT_FLOAT32 : WEFT_FLOAT64, 2},
                op, avg, false, o};
    }
    weft_dtype d;
    if (!weft_dtype_of(s, &d))
        refuse(std::string("a reduction of ") + c10::toString(s) +
               " is not supported; use bool, float16, bfloat16, float32, "
               "float64, int8, uint8, int32, int64 or complex (SUM)");
    return {{d, 1}, op, avg, false, o};
}

// t (rows: one per rank, each the result's size) folded by a bitwise op
// into out.
void fold_bitwise(const at::Tensor &rows, at::Tensor out,
                  c10d::ReduceOp::RedOpType o)
{
    at::Tensor acc = rows[0].clone();
    for (int64_t i = 1; i < rows.size(0); i++) {
        if (o == c10d::ReduceOp::BAND)
            acc.bitwise_and_(rows[i]);
        else if (o == c10d::ReduceOp::BOR)
            acc.bitwise_or_(rows[i]);
        else
            acc.bitwise_xor_(rows[i]);
    }
    out.copy_(acc.view(out.sizes()));
}

std::string hexbytes(const unsigned char *b, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++) {
        s += digits[b[i] >> 4];
        s += digits[b[i] & 15];
    }
    return s;
}

// The address this host is reached at from MASTER_ADDR's host: the local
// end of a UDP socket connected there (connect sends nothing). 127.0.0.1
// where MASTER_ADDR is unset, loopback or does not resolve.
std::string local_addr()
{
    const char *env = std::getenv("WEFT_LISTEN_ADDR");
    if (env != nullptr && *env)
        return env;
    const char *master = std::getenv("MASTER_ADDR");
    std::string out = "127.0.0.1";
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    if (master == nullptr || !*master ||
        getaddrinfo(master, "9", &hints, &res) != 0)
        return out;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    char ip[INET_ADDRSTRLEN];
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0 &&
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip) != nullptr &&
        (ntohl(sa.sin_addr.s_addr) >> 24) != 127)
        out = ip;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return out;
}

// The hostfile weftrun gives (cables, wires) serves one communicator at a
// time: its ports are the ranks' own. Others bootstrap from the store.
std::atomic<int> hostfile_taken{0};

class WorkWeft;
class ProcessGroupWeft;

// The main thread's wait, for Ctrl-C (see the top). Its fields are guarded by
// mu, which is never held while waiting for anything else; never freed, since
// the watcher thread may call in until exit.
struct MainWait {
    std::mutex mu;
    pthread_t main_thread{}; // Python's main thread
    bool main_known = false;
    c10::intrusive_ptr<ProcessGroupWeft> pg; // the group of the main
                                             // thread's wait
    bool hit = false; // that wait was aborted by SIGINT
    // weft._comm.sigint_check: claims the signals that came before a wait.
    py::object *check = nullptr;
};

MainWait &main_wait()
{
    static auto *mw = new MainWait;
    return *mw;
}

bool on_main_thread()
{
    MainWait &mw = main_wait();
    std::lock_guard<std::mutex> lock(mw.mu);
    return mw.main_known && pthread_equal(mw.main_thread, pthread_self());
}

// Runs Python's signal handlers now, in the main thread, and throws what
// they raised (KeyboardInterrupt) as that Python exception. A handler may
// raise nothing; then this returns.
void run_signal_handlers()
{
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0)
        throw py::error_already_set();
}

class ProcessGroupWeft : public WeftBase {
  public:
    ProcessGroupWeft(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                     int size, std::chrono::milliseconds timeout);
    // A group over a communicator made already (weft_comm_shrink's), which
    // it takes over.
    explicit ProcessGroupWeft(weft_comm *c)
        : WeftBase(weft_rank(c), weft_size(c)), comm_(c)
    {
        remember(this);
    }
    ~ProcessGroupWeft() override
    {
        forget(this);
        finalize();
        if (uses_hostfile_)
            hostfile_taken.store(0);
    }

    // Frees the communicator (its pending requests end with
    // WEFT_EABORTED); later operations fail. weft_finalize joins weft's
    // progress thread, whose completion callbacks may need the GIL (a
    // tensor that Python saw, freed there), so the GIL is let go first.
    void finalize()
    {
        weft_comm *c;
        {
            std::lock_guard<std::mutex> lock(post_mu_);
            c = comm_;
            comm_ = nullptr;
        }
        if (c == nullptr)
            return;
        if (Py_IsInitialized() && PyGILState_Check()) {
            py::gil_scoped_release nogil;
            weft_finalize(c);
        } else {
            weft_finalize(c);
        }
    }

    // Every live group, so that an exit handler can free them while the
    // interpreter still runs (a callback on weft's thread that needs the
    // GIL during the interpreter's own teardown would never get it).
    static void finalize_all()
    {
        std::vector<ProcessGroupWeft *> all;
        {
            std::lock_guard<std::mutex> lock(live_mu());
            all.assign(live().begin(), live().end());
        }
        for (auto *pg : all)
            pg->finalize();
    }

    const std::string getBackendName() const override
    {
        return "weft";
    }

    c10::intrusive_ptr<c10d::Work>
    broadcast(std::vector<at::Tensor> &tensors,
              const c10d::BroadcastOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    allreduce(std::vector<at::Tensor> &tensors,
              const c10d::AllreduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    allgather(std::vector<std::vector<at::Tensor>> &outputs,
              std::vector<at::Tensor> &inputs,
              const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    _allgather_base(at::Tensor &output, at::Tensor &input,
                    const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    reduce_scatter(std::vector<at::Tensor> &outputs,
                   std::vector<std::vector<at::Tensor>> &inputs,
                   const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                         const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    allreduce_coalesced(std::vector<at::Tensor> &tensors,
                        const c10d::AllreduceCoalescedOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                        std::vector<at::Tensor> &inputs,
                        const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    reduce(std::vector<at::Tensor> &tensors,
           const c10d::ReduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    gather(std::vector<std::vector<at::Tensor>> &outputs,
           std::vector<at::Tensor> &inputs,
           const c10d::GatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    scatter(std::vector<at::Tensor> &outputs,
            std::vector<std::vector<at::Tensor>> &inputs,
            const c10d::ScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    alltoall_base(at::Tensor &output, at::Tensor &input,
                  std::vector<int64_t> &outputSplits,
                  std::vector<int64_t> &inputSplits,
                  const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    alltoall(std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
             const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors,
                                        int dst, int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors,
                                        int src, int tag) override;
    c10::intrusive_ptr<c10d::Work>
    recvAnysource(std::vector<at::Tensor> &tensors, int tag) override;
    c10::intrusive_ptr<c10d::Work>
    barrier(const c10d::BarrierOptions &opts) override;

    // weft_comm_shrink: a group of the ranks alive that call it; this one
    // is failed afterwards (it must still be destroyed).
    c10::intrusive_ptr<ProcessGroupWeft> shrink()
    {
        weft_comm *out = nullptr;
        int rc;
        {
            std::lock_guard<std::mutex> lock(post_mu_);
            if (comm_ == nullptr)
                throw WeftTorchError(WEFT_EABORTED,
                                     "weft: shrink: the process group was "
                                     "shut down");
            rc = weft_comm_shrink(comm_, &out);
        }
        if (rc != WEFT_OK)
            std::rethrow_exception(
                weft_error(rc, "weft: shrink", weft_last_error(nullptr)));
        return c10::make_intrusive<ProcessGroupWeft>(out);
    }

    // weft_comm_origin_rank: member r's rank in the group weft made first.
    int origin_rank(int r)
    {
        std::lock_guard<std::mutex> lock(post_mu_);
        return comm_ == nullptr ? -1 : weft_comm_origin_rank(comm_, r);
    }

    // Group sequence numbers (torch's desync checks): every rank starts
    // at 0 and counts the collectives it posts, in the order every rank
    // posts them.
    void setSequenceNumberForGroup() override
    {
    }
    uint64_t getSequenceNumberForGroup() override
    {
        return seq_.load();
    }

    void abort()
    {
        std::lock_guard<std::mutex> lock(post_mu_);
        if (comm_ != nullptr)
            weft_abort(comm_);
    }

    // Called, with the GIL, by weft's SIGINT watcher thread for a SIGINT
    // that came after the main thread's wait registered: aborts its group.
    static void interrupt_main_wait()
    {
        c10::intrusive_ptr<ProcessGroupWeft> pg;
        {
            MainWait &mw = main_wait();
            std::lock_guard<std::mutex> lock(mw.mu);
            if (!mw.pg)
                return;
            mw.hit = true;
            pg = mw.pg;
        }
        // A thread that holds the group's post lock may want the GIL (a
        // completion callback that frees a tensor).
        py::gil_scoped_release nogil;
        pg->abort();
    }
    static void watch_main_thread(unsigned long ident, py::object check)
    {
        // Python's thread ident is the thread's pthread_t.
        MainWait &mw = main_wait();
        std::lock_guard<std::mutex> lock(mw.mu);
        mw.main_thread = (pthread_t)ident;
        mw.main_known = true;
        if (mw.check == nullptr)
            mw.check = new py::object(check);
    }
    // How this group found its peers: "hostfile" or "store".
    std::string bootstrap() const
    {
        return uses_hostfile_ ? "hostfile" : "store";
    }

  private:
    friend class WorkWeft;
    static std::mutex &live_mu()
    {
        static std::mutex *m = new std::mutex;
        return *m;
    }
    static std::set<ProcessGroupWeft *> &live()
    {
        static auto *s = new std::set<ProcessGroupWeft *>;
        return *s;
    }
    static void remember(ProcessGroupWeft *pg)
    {
        std::lock_guard<std::mutex> lock(live_mu());
        live().insert(pg);
    }
    static void forget(ProcessGroupWeft *pg)
    {
        std::lock_guard<std::mutex> lock(live_mu());
        live().erase(pg);
    }

    c10::intrusive_ptr<c10d::Work>
    post(c10::intrusive_ptr<WorkWeft> w, const char *what,
         const std::function<int(weft_request **)> &start);

    // Posts an all_reduce of buf (contiguous) by red: AVG's division and a
    // bitwise fold go into w's after_ steps.
    c10::intrusive_ptr<c10d::Work>
    post_allreduce(c10::intrusive_ptr<WorkWeft> w, const at::Tensor &buf,
                   const Reduced &red, const char *what);
    c10::intrusive_ptr<c10d::Work>
    allreduce_sparse(std::vector<at::Tensor> &tensors,
                     const c10d::AllreduceOptions &opts);

    weft_comm *comm_ = nullptr;
    bool uses_hostfile_ = false;
    std::atomic<uint64_t> seq_{0}; // collectives posted
    std::mutex post_mu_; // posts come from one thread at a time (weft.h)
};

// A Work backed by a weft request. It keeps the tensors it was given
// (weft borrows their memory until the request completes) and, where the
// operation needs one, a staging tensor and what to do after the request
// (copy out, divide for AVG).
class WorkWeft : public c10d::Work {
  public:
    WorkWeft(ProcessGroupWeft *pg, c10d::OpType type,
             std::vector<at::Tensor> outputs)
        : c10d::Work(pg->getRank(), type),
          outputs_(std::move(outputs)),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get())))
    {
    }
    ~WorkWeft() override
    {
        // Pending or not: weft frees it once complete.
        weft_request_free(req_);
    }

    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override
    {
        return future_;
    }
    // weft_wait first: where nobody runs weft's queue yet it runs it on
    // this thread, and else it polls a moment before it sleeps where the
    // host has cores to spare; a hand-off to weft's progress thread and a
    // wake-up back cost more than a small all_reduce. The request is done
    // only after its callback finished this Work, so the base's wait then
    // returns (or throws the error) at once. With a timeout, only the
    // base's wait. (0 is torch's kNoTimeout, in c10d:: from 2.x and global
    // in 1.13.)
    bool wait(std::chrono::milliseconds timeout =
                  std::chrono::milliseconds(0)) override
    {
        auto pg = pg_.lock();
        if (!pg || !on_main_thread())
            return wait_here(timeout);
        enter_main_wait(std::move(pg));
        bool done;
        try {
            done = wait_here(timeout);
        } catch (...) {
            // Aborted by SIGINT: KeyboardInterrupt rather than weft's
            // AbortedError, unless the handler raises nothing.
            if (leave_main_wait())
                run_signal_handlers();
            throw;
        }
        if (leave_main_wait())
            run_signal_handlers();
        return done;
    }
    std::vector<at::Tensor> result() override
    {
        return outputs_;
    }

    std::vector<at::Tensor> keep_; // inputs and staging, borrowed by weft
    std::vector<size_t> counts_;   // all_to_allv's counts and displacements
    // Run on success, in order, before completion: after_ (copy out of a
    // staging buffer, divide for AVG), then back_ (copy a staged output
    // back into the caller's non-contiguous tensor).
    std::vector<std::function<void()>> after_, back_;

    void then(std::function<void()> f)
    {
        after_.push_back(std::move(f));
    }
    // AVG: weft sums, then t (the result) is divided by the group's size.
    void divide_after(at::Tensor t, int n)
    {
        then([t, n]() mutable { t.div_(n); });
    }
    // The memory weft takes for t: t itself where contiguous, else a
    // contiguous copy taken now, kept by the Work and, for an output,
    // copied back into t on success.
    at::Tensor stage(const at::Tensor &t, bool output)
    {
        if (t.is_contiguous())
            return t;
        at::Tensor c = t.contiguous();
        keep_.push_back(c);
        if (output) {
            at::Tensor dst = t;
            back_.push_back([dst, c]() mutable { dst.copy_(c); });
        }
        return c;
    }
    // recv from any source: the rank the message came from.
    int sourceRank() const override
    {
        int src = weft_request_source(req_);
        if (src < 0)
            return c10d::Work::sourceRank();
        return src;
    }
    const char *what_ = "";

  private:
    friend class ProcessGroupWeft;
    bool wait_here(std::chrono::milliseconds timeout)
    {
        if (timeout.count() == 0 && req_ != nullptr)
            weft_wait(req_);
        return c10d::Work::wait(timeout);
    }
    // Registers the main thread's wait on pg, then claims the signals that
    // came before it (KeyboardInterrupt here, before anything blocks, if
    // Python has not handled them yet).
    static void enter_main_wait(c10::intrusive_ptr<ProcessGroupWeft> pg)
    {
        MainWait &mw = main_wait();
        py::gil_scoped_acquire gil;
        {
            std::lock_guard<std::mutex> lock(mw.mu);
            mw.pg = std::move(pg);
            mw.hit = false;
        }
        try {
            if (mw.check != nullptr)
                (*mw.check)();
        } catch (...) {
            leave_main_wait();
            throw;
        }
    }
    // Whether SIGINT aborted the wait.
    static bool leave_main_wait()
    {
        MainWait &mw = main_wait();
        c10::intrusive_ptr<ProcessGroupWeft> pg; // dropped after the lock
        std::lock_guard<std::mutex> lock(mw.mu);
        bool hit = mw.hit;
        pg = std::move(mw.pg);
        mw.hit = false;
        return hit;
    }

    static void on_complete(weft_request *, int result, void *arg)
    {
        // The reference the request held; this may be the last one.
        auto *held = static_cast<c10::intrusive_ptr<WorkWeft> *>(arg);
        (*held)->complete(result);
        delete held;
    }
    void complete(int result)
    {
        std::exception_ptr e;
        if (result == WEFT_OK) {
            try {
                for (auto &f : after_)
                    f();
                for (auto &f : back_)
                    f();
            } catch (...) {
                e = std::current_exception();
            }
        } else if (result != WEFT_OK) {
            e = weft_error(result, std::string("weft: ") + what_,
                           weft_last_error(comm_));
        }
        // The tensors stay with the Work until it is freed: freeing one
        // that Python saw takes the GIL, which a thread blocked in wait()
        // may hold.
        finish(e);
        if (e)
            future_->setError(e);
        else
            future_->markCompleted(c10::IValue(outputs_));
    }

    weft_comm *comm_ = nullptr;      // set by post(), for the error message
    c10::weak_intrusive_ptr<ProcessGroupWeft> pg_{
        c10::intrusive_ptr<ProcessGroupWeft>()}; // set by post(), for Ctrl-C
    weft_request *req_ = nullptr;
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

ProcessGroupWeft::ProcessGroupWeft(
    const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
    std::chrono::milliseconds timeout)
    : WeftBase(rank, size)
{
    long long ms = timeout.count();
    weft_config cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.rank = rank;
    cfg.size = size;
    cfg.timeout_ms = ms <= 0 ? 0 : ms > INT_MAX ? INT_MAX : (int)ms;
    cfg.connect_timeout_ms = cfg.timeout_ms;

    const char *hf = std::getenv("WEFT_HOSTFILE");
    const char *hft = std::getenv("WEFT_HOSTFILE_TEXT");
    const char *wsize = std::getenv("WEFT_SIZE");
    int expect = 0;
    // weftrun's hostfile (its cables and wires) for the first group that
    // spans the job; a second, or a smaller group, goes through the store.
    if (((hf && *hf) || (hft && *hft)) && wsize && std::atoi(wsize) == size &&
        hostfile_taken.compare_exchange_strong(expect, 1)) {
        uses_hostfile_ = true;
        // rank and size are torch's; the rest (hostfile, token, wires,
        // transport, topology) weftrun's environment.
        int rc = weft_init_config(&comm_, &cfg);
        if (rc != WEFT_OK) {
            hostfile_taken.store(0);
            std::rethrow_exception(
                weft_error(rc, "weft: init from the hostfile",
                           weft_last_error(nullptr)));
        }
        remember(this);
        return;
    }

    std::string token;
    if (rank == 0) {
        unsigned char b[16];
        std::random_device rd;
        for (auto &x : b)
            x = (unsigned char)rd();
        token = hexbytes(b, sizeof b);
        store->set("weft/token", std::vector<uint8_t>(token.begin(),
                                                      token.end()));
    } else {
        auto v = store->get("weft/token");
        token.assign(v.begin(), v.end());
    }

    weft_listener *l = nullptr;
    char addr[64];
    std::string host = local_addr();
    int rc = weft_listener_open(&l, host.c_str(), addr, sizeof addr);
    if (rc != WEFT_OK)
        std::rethrow_exception(weft_error(rc, "weft: listener on " + host,
                                          weft_last_error(nullptr)));
    std::vector<std::string> addrs((size_t)size);
    std::vector<const char *> ptrs((size_t)size);
    try {
        store->set("weft/addr/" + std::to_string(rank),
                   std::vector<uint8_t>(addr, addr + std::strlen(addr)));
        for (int r = 0; r < size; r++) {
            auto v = store->get("weft/addr/" + std::to_string(r));
            addrs[(size_t)r].assign(v.begin(), v.end());
            ptrs[(size_t)r] = addrs[(size_t)r].c_str();
        }
    } catch (...) {
        weft_listener_close(l);
        throw;
    }
    cfg.addrs = ptrs.data();
    cfg.listener = l;
    cfg.token = token.c_str();
    rc = weft_init_config(&comm_, &cfg);
    if (rc != WEFT_OK)
        std::rethrow_exception(weft_error(rc, "weft: init from the store",
                                          weft_last_error(nullptr)));
    remember(this);
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::post(c10::intrusive_ptr<WorkWeft> w, const char *what,
                       const std::function<int(weft_request **)> &start)
{
    w->what_ = what;
    std::lock_guard<std::mutex> lock(post_mu_);
    if (comm_ == nullptr)
        throw WeftTorchError(WEFT_EABORTED,
                             std::string("weft: ") + what +
                                 ": the process group was shut down");
    w->comm_ = comm_;
    w->pg_ = c10::intrusive_ptr<ProcessGroupWeft>::
        unsafe_reclaim_from_nonowning(this);
    int rc = start(&w->req_);
    if (rc != WEFT_OK)
        std::rethrow_exception(weft_error(rc, std::string("weft: ") + what,
                                          weft_last_error(comm_)));
    c10d::OpType type = w->retrieveOpType();
    if (type != c10d::OpType::SEND && type != c10d::OpType::RECV &&
        type != c10d::OpType::RECVANYSOURCE)
        seq_++;
    // The request holds a reference until its callback has run.
    weft_request_on_complete(w->req_, &WorkWeft::on_complete,
                             new c10::intrusive_ptr<WorkWeft>(w));
    return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::broadcast(std::vector<at::Tensor> &tensors,
                            const c10d::BroadcastOptions &opts)
{
    const at::Tensor &t = only(tensors, "broadcast");
    if (opts.rootTensor != 0)
        unsupported("broadcast: rootTensor must be 0");
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::BROADCAST,
                                           tensors);
    int root = to_c_int(opts.rootRank, "broadcast: root (src)");
    at::Tensor buf = w->stage(t, true);
    Wire wire = moved(buf);
    return post(w, "broadcast", [&](weft_request **r) {
        return weft_ibroadcast(comm_, buf.data_ptr(), wire.count(buf),
                               wire.dtype, root, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::post_allreduce(c10::intrusive_ptr<WorkWeft> w,
                                 const at::Tensor &buf, const Reduced &red,
                                 const char *what)
{
    if (red.bitwise) {
        // Every rank's tensor, then folded here.
        at::Tensor rows = at::empty({getSize(), buf.numel()}, buf.options());
        w->keep_.push_back(rows);
        c10d::ReduceOp::RedOpType bit = red.bit;
        at::Tensor out = buf;
        w->then([rows, out, bit]() { fold_bitwise(rows, out, bit); });
        Wire wire = moved(buf);
        return post(w, what, [&](weft_request **r) {
            return weft_iall_gather(comm_, buf.data_ptr(), rows.data_ptr(),
                                    wire.count(buf), wire.dtype, r);
        });
    }
    if (red.avg)
        w->divide_after(buf, getSize());
    return post(w, what, [&](weft_request **r) {
        return weft_iall_reduce(comm_, buf.data_ptr(), buf.data_ptr(),
                                red.wire.count(buf), red.wire.dtype, red.op,
                                r);
    });
}

// A sparse all_reduce (SUM), as gloo does it: every rank's coalesced
// indices and values gathered, and summed where they meet (coalesce). The
// counts and shapes go first (a small all_gather, waited for here), then
// one all_gather of each rank's indices and values end to end, padded to
// the largest count; the caller's tensor takes the result.
c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::allreduce_sparse(std::vector<at::Tensor> &tensors,
                                   const c10d::AllreduceOptions &opts)
{
    const at::Tensor &t = tensors[0];
    if (!t.device().is_cpu())
        unsupported("all_reduce: a sparse tensor on " + t.device().str() +
                    "; weft supports CPU tensors only");
    if (opts.reduceOp != c10d::ReduceOp::SUM)
        unsupported("all_reduce: a sparse tensor is reduced by SUM only");
    at::Tensor in = t.coalesce();
    at::Tensor idx = in._indices().contiguous(); // [sparse dims, nnz]
    at::Tensor val = in._values().contiguous();  // [nnz, dense sizes...]
    const int64_t nnz = in._nnz(), sd = in.sparse_dim();
    int64_t per = 1; // values per index
    for (int64_t d = 1; d < val.dim(); d++)
        per *= val.size(d);
    const int64_t esz = (int64_t)val.element_size();
    // What every rank must agree on: the shape, sparse dims, dtype.
    uint64_t shape = 14695981039346656037ull;
    auto mix = [&shape](uint64_t v) {
        shape = (shape ^ v) * 1099511628211ull;
    };
    for (int64_t s : t.sizes())
        mix((uint64_t)s);
    mix((uint64_t)sd);
    mix((uint64_t)t.scalar_type());
    const int n = getSize();
    std::vector<int64_t> meta = {nnz, (int64_t)shape};
    std::vector<int64_t> all((size_t)(2 * n));
    {
        std::lock_guard<std::mutex> lock(post_mu_);
        if (comm_ == nullptr)
            throw WeftTorchError(WEFT_EABORTED, "weft: all_reduce: the "
                                                "process group was shut down");
        // torch's bindings call collectives without the GIL; a call from
        // C++ that holds it lets it go while this waits.
        int rc;
        if (Py_IsInitialized() && PyGILState_Check()) {
            py::gil_scoped_release nogil;
            rc = weft_all_gather(comm_, meta.data(), all.data(), 2,
                                 WEFT_INT64);
        } else {
            rc = weft_all_gather(comm_, meta.data(), all.data(), 2,
                                 WEFT_INT64);
        }
        if (rc != WEFT_OK)
            std::rethrow_exception(weft_error(rc, "weft: all_reduce (sparse)",
                                              weft_last_error(comm_)));
    }
    int64_t most = 0;
    for (int r = 0; r < n; r++) {
        if (all[(size_t)(2 * r + 1)] != (int64_t)shape)
            std::rethrow_exception(weft_error(
                WEFT_EMISMATCH, "weft: all_reduce (sparse)",
                ("rank " + std::to_string(r) +
                 "'s sparse tensor differs from this rank's in shape, "
                 "sparse dimensions or dtype")
                    .c_str()));
        most = std::max(most, all[(size_t)(2 * r)]);
    }
    const int64_t ib = sd * most * 8, block = std::max<int64_t>(
                                          ib + most * per * esz, 1);
    at::Tensor mine = at::zeros({block}, at::kByte);
    at::Tensor rows = at::empty({n * block}, at::kByte);
    char *m = (char *)mine.data_ptr();
    for (int64_t d = 0; d < sd; d++)
        std::memcpy(m + d * most * 8, (char *)idx.data_ptr() + d * nnz * 8,
                    (size_t)(nnz * 8));
    std::memcpy(m + ib, val.data_ptr(), (size_t)(nnz * per * esz));
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::ALLREDUCE,
                                           tensors);
    w->keep_.push_back(mine);
    w->keep_.push_back(rows);
    at::Tensor dst = t;
    w->then([=]() mutable {
        int64_t total = 0;
        for (int r = 0; r < n; r++)
            total += all[(size_t)(2 * r)];
        std::vector<int64_t> vsizes = val.sizes().vec();
        vsizes[0] = total;
        at::Tensor gi = at::empty({sd, total}, idx.options());
        at::Tensor gv = at::empty(vsizes, val.options());
        int64_t at_ = 0;
        for (int r = 0; r < n; r++) {
            const char *b = (const char *)rows.data_ptr() + r * block;
            int64_t k = all[(size_t)(2 * r)];
            for (int64_t d = 0; d < sd; d++)
                std::memcpy((char *)gi.data_ptr() + (d * total + at_) * 8,
                            b + d * most * 8, (size_t)(k * 8));
            std::memcpy((char *)gv.data_ptr() + at_ * per * esz, b + ib,
                        (size_t)(k * per * esz));
            at_ += k;
        }
        dst.copy_(at::sparse_coo_tensor(gi, gv, dst.sizes(), dst.options())
                      .coalesce());
    });
    return post(w, "all_reduce (sparse)", [&](weft_request **r) {
        return weft_iall_gather(comm_, mine.data_ptr(), rows.data_ptr(),
                                (size_t)block, WEFT_UINT8, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::allreduce(std::vector<at::Tensor> &tensors,
                            const c10d::AllreduceOptions &opts)
{
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse())
        return allreduce_sparse(tensors, opts);
    const at::Tensor &t = only(tensors, "all_reduce");
    Reduced red = reduced(opts.reduceOp, t, "all_reduce");
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::ALLREDUCE,
                                           tensors);
    at::Tensor buf = w->stage(t, true);
    return post_allreduce(w, buf, red, "all_reduce");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allreduce_coalesced(
    std::vector<at::Tensor> &tensors,
    const c10d::AllreduceCoalescedOptions &opts)
{
    if (tensors.empty())
        unsupported("all_reduce_coalesced: no tensors");
    for (auto &t : tensors) {
        check_tensor(t, "all_reduce_coalesced");
        same_dtype(t, tensors[0], "all_reduce_coalesced");
    }
    Reduced red = reduced(opts.reduceOp, tensors[0], "all_reduce_coalesced");
    // The tensors end to end in one buffer, reduced at once, copied back.
    int64_t total = 0;
    for (auto &t : tensors)
        total += t.numel();
    at::Tensor flat = at::empty({total}, tensors[0].options());
    char *p = (char *)flat.data_ptr();
    for (auto &t : tensors) {
        bytes_out(t, p);
        p += t.nbytes();
    }
    auto w = c10::make_intrusive<WorkWeft>(
        this, c10d::OpType::ALLREDUCE_COALESCED, tensors);
    w->keep_.push_back(flat);
    std::vector<at::Tensor> outs = tensors;
    w->back_.push_back([flat, outs]() {
        const char *q = (const char *)flat.data_ptr();
        for (auto &o : outs) {
            bytes_in(o, q);
            q += o.nbytes();
        }
    });
    return post_allreduce(w, flat, red, "all_reduce_coalesced");
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::reduce(std::vector<at::Tensor> &tensors,
                         const c10d::ReduceOptions &opts)
{
    const at::Tensor &t = only(tensors, "reduce");
    if (opts.rootTensor != 0)
        unsupported("reduce: rootTensor must be 0");
    int root = to_c_int(opts.rootRank, "reduce: root (dst)");
    Reduced red = reduced(opts.reduceOp, t, "reduce");
    bool am_root = root == getRank();
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::REDUCE,
                                           tensors);
    // The root's tensor takes the result (in place); the others' are
    // only read.
    at::Tensor buf = w->stage(t, am_root);
    if (red.bitwise) {
        at::Tensor rows = at::empty({am_root ? getSize() : 0, buf.numel()},
                                    buf.options());
        w->keep_.push_back(rows);
        if (am_root) {
            c10d::ReduceOp::RedOpType bit = red.bit;
            w->then([rows, buf, bit]() { fold_bitwise(rows, buf, bit); });
        }
        Wire wire = moved(buf);
        return post(w, "reduce", [&](weft_request **r) {
            return weft_igather(comm_, buf.data_ptr(),
                                am_root ? rows.data_ptr() : nullptr,
                                wire.count(buf), wire.dtype, root, r);
        });
    }
    if (red.avg && am_root)
        w->divide_after(buf, getSize());
    return post(w, "reduce", [&](weft_request **r) {
        return weft_ireduce(comm_, buf.data_ptr(),
                            am_root ? buf.data_ptr() : nullptr,
                            red.wire.count(buf), red.wire.dtype, red.op, root,
                            r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::_allgather_base(at::Tensor &output, at::Tensor &input,
                                  const c10d::AllgatherOptions &)
{
    check_tensor(input, "all_gather_into_tensor");
    check_tensor(output, "all_gather_into_tensor");
    if (output.scalar_type() != input.scalar_type() ||
        output.numel() != input.numel() * getSize())
        unsupported("all_gather_into_tensor: the output must have the "
                    "input's dtype and world_size times its elements");
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::_ALLGATHER_BASE,
                                           std::vector<at::Tensor>{output});
    at::Tensor in = w->stage(input, false);
    at::Tensor out = w->stage(output, true);
    w->keep_.push_back(in);
    Wire wire = moved(in);
    return post(w, "all_gather_into_tensor", [&](weft_request **r) {
        return weft_iall_gather(comm_, in.data_ptr(), out.data_ptr(),
                                wire.count(in), wire.dtype, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                            std::vector<at::Tensor> &inputs,
                            const c10d::AllgatherOptions &)
{
    const at::Tensor &input = only(inputs, "all_gather");
    if (outputs.size() != 1 || outputs[0].size() != (size_t)getSize())
        unsupported("all_gather: expected one list of world_size tensors");
    for (auto &o : outputs[0]) {
        check_tensor(o, "all_gather");
        if (o.scalar_type() != input.scalar_type() ||
            o.numel() != input.numel())
            unsupported("all_gather: every output must have the input's "
                        "dtype and number of elements");
    }
    // Gathered into one buffer, then copied into each output.
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::ALLGATHER,
                                           outputs[0]);
    at::Tensor in = w->stage(input, false);
    at::Tensor flat = at::empty({in.numel() * getSize()}, in.options());
    w->keep_ = {in, flat};
    std::vector<at::Tensor> outs = outputs[0];
    w->then([flat, outs]() {
        const char *q = (const char *)flat.data_ptr();
        for (auto &o : outs) {
            bytes_in(o, q);
            q += o.nbytes();
        }
    });
    Wire wire = moved(in);
    return post(w, "all_gather", [&](weft_request **r) {
        return weft_iall_gather(comm_, in.data_ptr(), flat.data_ptr(),
                                wire.count(in), wire.dtype, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allgather_coalesced(
    std::vector<std::vector<at::Tensor>> &outputs,
    std::vector<at::Tensor> &inputs, const c10d::AllgatherOptions &)
{
    const char *what = "all_gather_coalesced";
    if (outputs.size() != (size_t)getSize())
        unsupported(std::string(what) +
                    ": expected world_size lists of output tensors");
    for (auto &t : inputs)
        check_tensor(t, what);
    for (auto &list : outputs) {
        if (list.size() != inputs.size())
            unsupported(std::string(what) + ": each output list must hold "
                        "as many tensors as the input list");
        for (size_t j = 0; j < list.size(); j++) {
            check_tensor(list[j], what);
            if (list[j].scalar_type() != inputs[j].scalar_type() ||
                list[j].numel() != inputs[j].numel())
                unsupported(std::string(what) + ": output " +
                            std::to_string(j) + " of each list must have "
                            "input " + std::to_string(j) +
                            "'s dtype and number of elements");
        }
    }
    // Every input's bytes end to end (any dtypes), gathered as bytes.
    int64_t bytes = 0;
    for (auto &t : inputs)
        bytes += (int64_t)t.nbytes();
    at::Tensor in = at::empty({bytes}, at::kByte);
    char *p = (char *)in.data_ptr();
    for (auto &t : inputs) {
        bytes_out(t, p);
        p += t.nbytes();
    }
    at::Tensor flat = at::empty({bytes * getSize()}, at::kByte);
    std::vector<at::Tensor> all;
    for (auto &list : outputs)
        all.insert(all.end(), list.begin(), list.end());
    auto w = c10::make_intrusive<WorkWeft>(
        this, c10d::OpType::ALLGATHER_COALESCED, all);
    w->keep_ = {in, flat};
    w->then([flat, all]() {
        const char *q = (const char *)flat.data_ptr();
        for (auto &o : all) {
            bytes_in(o, q);
            q += o.nbytes();
        }
    });
    return post(w, what, [&](weft_request **r) {
        return weft_iall_gather(comm_, in.data_ptr(), flat.data_ptr(),
                                (size_t)bytes, WEFT_UINT8, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::gather(std::vector<std::vector<at::Tensor>> &outputs,
                         std::vector<at::Tensor> &inputs,
                         const c10d::GatherOptions &opts)
{
    const at::Tensor &input = only(inputs, "gather");
    int root = to_c_int(opts.rootRank, "gather: root (dst)");
    bool am_root = root == getRank();
    if (am_root) {
        if (outputs.size() != 1 || outputs[0].size() != (size_t)getSize())
            unsupported("gather: the root needs one list of world_size "
                        "output tensors");
        for (auto &o : outputs[0]) {
            check_tensor(o, "gather");
            if (o.scalar_type() != input.scalar_type() ||
                o.numel() != input.numel())
                unsupported("gather: every output must have the input's "
                            "dtype and number of elements");
        }
    } else if (!outputs.empty()) {
        unsupported("gather: only the root takes output tensors");
    }
    std::vector<at::Tensor> outs = am_root ? outputs[0]
                                           : std::vector<at::Tensor>{};
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::GATHER, outs);
    at::Tensor in = w->stage(input, false);
    at::Tensor flat = at::empty({am_root ? in.numel() * getSize() : 0},
                                in.options());
    w->keep_ = {in, flat};
    if (am_root)
        w->then([flat, outs]() {
            const char *q = (const char *)flat.data_ptr();
            for (auto &o : outs) {
                bytes_in(o, q);
                q += o.nbytes();
            }
        });
    Wire wire = moved(in);
    return post(w, "gather", [&](weft_request **r) {
        return weft_igather(comm_, in.data_ptr(),
                            am_root ? flat.data_ptr() : nullptr,
                            wire.count(in), wire.dtype, root, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::scatter(std::vector<at::Tensor> &outputs,
                          std::vector<std::vector<at::Tensor>> &inputs,
                          const c10d::ScatterOptions &opts)
{
    const at::Tensor &output = only(outputs, "scatter");
    int root = to_c_int(opts.rootRank, "scatter: root (src)");
    bool am_root = root == getRank();
    if (am_root) {
        if (inputs.size() != 1 || inputs[0].size() != (size_t)getSize())
            unsupported("scatter: the root needs one list of world_size "
                        "input tensors");
        for (auto &i : inputs[0]) {
            check_tensor(i, "scatter");
            if (i.scalar_type() != output.scalar_type() ||
                i.numel() != output.numel())
                unsupported("scatter: every input must have the output's "
                            "dtype and number of elements");
        }
    } else if (!inputs.empty()) {
        unsupported("scatter: only the root takes input tensors");
    }
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::SCATTER,
                                           outputs);
    at::Tensor out = w->stage(output, true);
    // The root's inputs end to end, copied now: the caller may reuse them.
    at::Tensor flat = at::empty({am_root ? out.numel() * getSize() : 0},
                                out.options());
    if (am_root) {
        char *p = (char *)flat.data_ptr();
        for (auto &i : inputs[0]) {
            bytes_out(i, p);
            p += i.nbytes();
        }
    }
    w->keep_.push_back(flat);
    Wire wire = moved(out);
    return post(w, "scatter", [&](weft_request **r) {
        return weft_iscatter(comm_, am_root ? flat.data_ptr() : nullptr,
                             out.data_ptr(), wire.count(out), wire.dtype,
                             root, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                       const c10d::ReduceScatterOptions &opts)
{
    check_tensor(input, "reduce_scatter_tensor");
    check_tensor(output, "reduce_scatter_tensor");
    if (output.scalar_type() != input.scalar_type() ||
        input.numel() != output.numel() * getSize())
        unsupported("reduce_scatter_tensor: the input must have the output's "
                    "dtype and world_size times its elements");
    Reduced red = reduced(opts.reduceOp, output, "reduce_scatter_tensor");
    if (red.bitwise)
        unsupported("reduce_scatter_tensor: BAND, BOR and BXOR are "
                    "supported by all_reduce and reduce only");
    auto w = c10::make_intrusive<WorkWeft>(
        this, c10d::OpType::_REDUCE_SCATTER_BASE,
        std::vector<at::Tensor>{output});
    at::Tensor in = w->stage(input, false);
    at::Tensor out = w->stage(output, true);
    w->keep_.push_back(in);
    if (red.avg)
        w->divide_after(out, getSize());
    return post(w, "reduce_scatter_tensor", [&](weft_request **r) {
        return weft_ireduce_scatter(comm_, in.data_ptr(), out.data_ptr(),
                                    red.wire.count(out), red.wire.dtype,
                                    red.op, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::reduce_scatter(std::vector<at::Tensor> &outputs,
                                 std::vector<std::vector<at::Tensor>> &inputs,
                                 const c10d::ReduceScatterOptions &opts)
{
    const at::Tensor &output = only(outputs, "reduce_scatter");
    if (inputs.size() != 1 || inputs[0].size() != (size_t)getSize())
        unsupported("reduce_scatter: expected one list of world_size tensors");
    for (auto &i : inputs[0]) {
        check_tensor(i, "reduce_scatter");
        if (i.scalar_type() != output.scalar_type() ||
            i.numel() != output.numel())
            unsupported("reduce_scatter: every input must have the output's "
                        "dtype and number of elements");
    }
    Reduced red = reduced(opts.reduceOp, output, "reduce_scatter");
    if (red.bitwise)
        unsupported("reduce_scatter: BAND, BOR and BXOR are supported by "
                    "all_reduce and reduce only");
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::REDUCE_SCATTER,
                                           outputs);
    at::Tensor out = w->stage(output, true);
    // The inputs laid end to end, copied now: the caller may reuse them.
    at::Tensor flat = at::empty({out.numel() * getSize()}, out.options());
    char *p = (char *)flat.data_ptr();
    for (auto &i : inputs[0]) {
        bytes_out(i, p);
        p += i.nbytes();
    }
    w->keep_.push_back(flat);
    if (red.avg)
        w->divide_after(out, getSize());
    return post(w, "reduce_scatter", [&](weft_request **r) {
        return weft_ireduce_scatter(comm_, flat.data_ptr(), out.data_ptr(),
                                    red.wire.count(out), red.wire.dtype,
                                    red.op, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::alltoall_base(
    at::Tensor &output, at::Tensor &input, std::vector<int64_t> &outputSplits,
    std::vector<int64_t> &inputSplits, const c10d::AllToAllOptions &)
{
    const char *what = "all_to_all_single";
    check_tensor(input, what);
    check_tensor(output, what);
    same_dtype(input, output, what);
    size_t n = (size_t)getSize();
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::ALLTOALL_BASE,
                                           std::vector<at::Tensor>{output});
    at::Tensor in = w->stage(input, false);
    at::Tensor out = w->stage(output, true);
    w->keep_.push_back(in);
    Wire wire = moved(in);
    if (inputSplits.empty() && outputSplits.empty()) {
        if (in.numel() % (int64_t)n != 0 || out.numel() != in.numel())
            unsupported(std::string(what) + ": without splits, input and "
                        "output must have one number of elements, a "
                        "multiple of world_size");
        size_t count = wire.count(in) / n;
        return post(w, what, [&](weft_request **r) {
            return weft_iall_to_all(comm_, in.data_ptr(), out.data_ptr(),
                                    count, wire.dtype, r);
        });
    }
    // Splits count rows (dim 0); no split list means equal rows.
    auto counts = [&](const at::Tensor &t, const std::vector<int64_t> &splits,
                      size_t *c, size_t *d, const char *side) {
        int64_t rows = t.dim() == 0 ? 1 : t.size(0);
        size_t row = rows == 0 ? 0 : wire.count(t) / (size_t)rows;
        if (!splits.empty() && splits.size() != n)
            unsupported(std::string(what) + ": " + side +
                        " splits must have world_size entries");
        if (splits.empty() && rows % (int64_t)n != 0)
            unsupported(std::string(what) + ": the " + side + "'s " +
                        std::to_string(rows) + " rows do not split evenly "
                        "among world_size ranks");
        int64_t sum = 0;
        for (size_t p = 0; p < n; p++) {
            int64_t s = splits.empty() ? rows / (int64_t)n : splits[p];
            if (s < 0)
                unsupported(std::string(what) + ": a negative split");
            c[p] = (size_t)s * row;
            d[p] = (size_t)sum * row;
            sum += s;
        }
        if (sum != rows)
            unsupported(std::string(what) + ": the " + side + " splits add "
                        "up to " + std::to_string(sum) + " rows, the " + side +
                        " has " + std::to_string(rows));
    };
    w->counts_.assign(4 * n, 0);
    size_t *c = w->counts_.data();
    counts(in, inputSplits, c, c + n, "input");
    counts(out, outputSplits, c + 2 * n, c + 3 * n, "output");
    return post(w, what, [&](weft_request **r) {
        return weft_iall_to_allv(comm_, in.data_ptr(), c, c + n,
                                 out.data_ptr(), c + 2 * n, c + 3 * n,
                                 wire.dtype, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::alltoall(std::vector<at::Tensor> &outputs,
                           std::vector<at::Tensor> &inputs,
                           const c10d::AllToAllOptions &)
{
    const char *what = "all_to_all";
    size_t n = (size_t)getSize();
    if (inputs.size() != n || outputs.size() != n)
        unsupported(std::string(what) + ": expected world_size input and "
                    "output tensors");
    for (size_t p = 0; p < n; p++) {
        check_tensor(inputs[p], what);
        check_tensor(outputs[p], what);
        same_dtype(inputs[p], inputs[0], what);
        same_dtype(outputs[p], inputs[0], what);
    }
    Wire wire = moved(inputs[0]);
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::ALLTOALL,
                                           outputs);
    // Inputs end to end (copied now), outputs from one buffer.
    w->counts_.assign(4 * n, 0);
    size_t *c = w->counts_.data();
    int64_t in_total = 0, out_total = 0;
    for (size_t p = 0; p < n; p++) {
        c[p] = wire.count(inputs[p]);
        c[n + p] = (size_t)in_total * wire.per;
        in_total += inputs[p].numel();
        c[2 * n + p] = wire.count(outputs[p]);
        c[3 * n + p] = (size_t)out_total * wire.per;
        out_total += outputs[p].numel();
    }
    at::Tensor in = at::empty({in_total}, inputs[0].options());
    at::Tensor out = at::empty({out_total}, inputs[0].options());
    char *q = (char *)in.data_ptr();
    for (auto &t : inputs) {
        bytes_out(t, q);
        q += t.nbytes();
    }
    w->keep_ = {in, out};
    std::vector<at::Tensor> outs = outputs;
    w->then([out, outs]() {
        const char *s = (const char *)out.data_ptr();
        for (auto &o : outs) {
            bytes_in(o, s);
            s += o.nbytes();
        }
    });
    return post(w, what, [&](weft_request **r) {
        return weft_iall_to_allv(comm_, in.data_ptr(), c, c + n,
                                 out.data_ptr(), c + 2 * n, c + 3 * n,
                                 wire.dtype, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::send(std::vector<at::Tensor> &tensors, int dst, int tag)
{
    const at::Tensor &t = only(tensors, "send");
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::SEND, tensors);
    at::Tensor buf = w->stage(t, false);
    Wire wire = moved(buf);
    return post(w, "send", [&](weft_request **r) {
        return weft_isend_tag(comm_, buf.data_ptr(), wire.count(buf),
                              wire.dtype, dst, tag, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::recv(std::vector<at::Tensor> &tensors, int src, int tag)
{
    const at::Tensor &t = only(tensors, "recv");
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::RECV, tensors);
    at::Tensor buf = w->stage(t, true);
    Wire wire = moved(buf);
    return post(w, "recv", [&](weft_request **r) {
        return weft_irecv_tag(comm_, buf.data_ptr(), wire.count(buf),
                              wire.dtype, src, tag, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::recvAnysource(std::vector<at::Tensor> &tensors, int tag)
{
    const at::Tensor &t = only(tensors, "recv");
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::RECVANYSOURCE,
                                           tensors);
    at::Tensor buf = w->stage(t, true);
    Wire wire = moved(buf);
    return post(w, "recv (any source)", [&](weft_request **r) {
        return weft_irecv_tag(comm_, buf.data_ptr(), wire.count(buf),
                              wire.dtype, WEFT_ANY_SOURCE, tag, r);
    });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupWeft::barrier(const c10d::BarrierOptions &)
{
    auto w = c10::make_intrusive<WorkWeft>(this, c10d::OpType::BARRIER,
                                           std::vector<at::Tensor>{});
    return post(w, "barrier",
                [&](weft_request **r) { return weft_ibarrier(comm_, r); });
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    // Torch's c10d types (Store, Backend or ProcessGroup, Work) must be
    // known to pybind11 before a class derives from them.
    py::module::import("torch.distributed");
    // Never freed: the translator may run until the interpreter exits.
    static py::object *error_classes = new py::object(py::dict());
    m.def("_set_error_classes", [](py::dict d) { *error_classes = d; });
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p)
                std::rethrow_exception(p);
        } catch (const WeftTorchError &e) {
            py::object cls = error_classes->attr("get")(e.code, py::none());
            PyErr_SetString(cls.is_none() ? PyExc_RuntimeError : cls.ptr(),
                            e.what());
        }
    });
    py::class_<ProcessGroupWeft, WeftBase,
               c10::intrusive_ptr<ProcessGroupWeft>>(m, "ProcessGroupWeft")
        .def(py::init<const c10::intrusive_ptr<c10d::Store> &, int, int,
                      std::chrono::milliseconds>(),
             py::arg("store"), py::arg("rank"), py::arg("size"),
             py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
        .def("abort", &ProcessGroupWeft::abort)
        .def("_shrink", &ProcessGroupWeft::shrink,
             py::call_guard<py::gil_scoped_release>())
        .def("_origin_rank", &ProcessGroupWeft::origin_rank)
        .def("_finalize", &ProcessGroupWeft::finalize)
        .def_property_readonly("_bootstrap", &ProcessGroupWeft::bootstrap);
    m.def("_finalize_all", &ProcessGroupWeft::finalize_all);
    m.def("_interrupt_main_wait", &ProcessGroupWeft::interrupt_main_wait);
    m.def("_watch_main_thread", &ProcessGroupWeft::watch_main_thread);
}
