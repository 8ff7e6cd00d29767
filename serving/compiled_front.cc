// The compiled front of `tfhash serve search --front compiled` (tfhash.serving.processes starts,
// supervises and stops it; tfhash.serving.native builds it against the system's gRPC C++ library).
//
//   compiled_front ADDRESS BACKENDS CHANNELS MAX_ROWS IN_FLIGHT MAX_WAITING MAX_REQUEST_BYTES GRACE_SECONDS PARENT
//
// It serves gRPC on ADDRESS (host:port, joining a port its parent holds: SO_REUSEPORT) and
// answers nothing by itself: the search service's processes listen on BACKENDS (comma-separated
// loopback addresses, one per process; CHANNELS connections to each, used in turn) and answer
// everything. What it does is pay gRPC's per-call cost once for several
// callers: it joins concurrent Search requests that differ only in their rows (packed codes of
// one width, or features of one shape, with the same k, radius and pinned version) into one
// request of up to MAX_ROWS rows (and MAX_REQUEST_BYTES bytes), at most IN_FLIGHT such requests
// of one kind at a time, and gives each caller its own
// rows of the answer, which names one model version for the whole joined request (so the
// service's version lock holds for each caller). Each caller keeps its own deadline (a joined
// request carries the latest of its callers'; the service's encoder sees the time left).
//
// Nothing of the service's contract moves here:
//  * a joined request that fails is sent again request by request, first in line and up to
//    kResends at once, so each caller gets exactly the status its own request gets from the
//    service (the request checks, limits, versions and errors stay the service's);
//  * what it cannot join goes through as it is (examples, signed codes, features that are not
//    finite, unknown or repeated fields, malformed bytes), as does a request when MAX_WAITING of
//    its kind already wait;
//  * a waiting request whose caller cancelled it or whose deadline passed is never sent: it ends
//    CANCELLED or DEADLINE_EXCEEDED, as its caller already sees it;
//  * GetStatus, health Check and the health Watch stream go through (Watch as a stream);
//  * requests over MAX_REQUEST_BYTES (the service's own limit) are refused RESOURCE_EXHAUSTED, as
//    the service refuses them.
//
// It prints "compiled search front on ADDRESS" to stderr once it serves. At SIGTERM it drains as
// the service does: it refuses new calls UNAVAILABLE, except health, which says NOT_SERVING (for
// the service's names; a Watch stream says it and ends OK, the open ones too), lets the calls it
// holds finish within GRACE_SECONDS and exits; its parent stops the service's processes only
// after that. It gets SIGTERM when its parent (process
// id PARENT; 0: none) dies, and exits at once if that has already happened.
//
// The messages are read and written in protobuf's wire format by hand (protoc and libprotobuf-dev
// are not needed): the front reads only the few fields of serving/search.proto it joins on.

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::system_clock;
const char kSearch[] = "/tfhash.serving.HashSearch/Search";
const char kStatus[] = "/tfhash.serving.HashSearch/GetStatus";
const char kHealthCheck[] = "/grpc.health.v1.Health/Check";
const char kHealthWatch[] = "/grpc.health.v1.Health/Watch";
const char kNotServing[] = "\x08\x02";  // HealthCheckResponse{status: NOT_SERVING}
constexpr int kResends = 8;  // a failed joined request's requests sent again at once, per kind

// Protobuf wire format, the parts the messages use.
bool ReadVarint(const uint8_t*& at, const uint8_t* end, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && at < end; shift += 7) {
    uint8_t byte = *at++;
    value |= uint64_t(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

void WriteVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(char(value | 0x80));
    value >>= 7;
  }
  out.push_back(char(value));
}

void WriteBytes(std::string& out, int field, const std::string& bytes) {
  WriteVarint(out, uint64_t(field) << 3 | 2);
  WriteVarint(out, bytes.size());
  out += bytes;
}

// Skips a field of wire type `type`; false if malformed or of a type proto3 does not write.
// A tag or a length: protobuf reads them as 32-bit varints of at most 5 bytes and refuses longer
// encodings (a value's varint may take 10). A length must also fit in what is left.
bool ReadTag(const uint8_t*& at, const uint8_t* end, uint64_t& value) {
  const uint8_t* start = at;
  return ReadVarint(at, end, value) && at - start <= 5 && value <= 0xFFFFFFFFu;
}

bool ReadLength(const uint8_t*& at, const uint8_t* end, uint64_t& value) {
  return ReadTag(at, end, value) && value <= 0x7FFFFFFFu && value <= uint64_t(end - at);
}

bool Skip(const uint8_t*& at, const uint8_t* end, int type) {
  uint64_t value;
  switch (type) {
    case 0: return ReadVarint(at, end, value);
    case 1: if (end - at < 8) return false; at += 8; return true;
    case 2: if (!ReadLength(at, end, value)) return false; at += value; return true;
    case 5: if (end - at < 4) return false; at += 4; return true;
    default: return false;
  }
}

// Reads a field of packed varints (or one unpacked varint) into `values`.
bool ReadInts(const uint8_t*& at, const uint8_t* end, int type, std::vector<int64_t>& values) {
  uint64_t value;
  if (type == 0) {
    if (!ReadVarint(at, end, value)) return false;
    values.push_back(int64_t(value));
    return true;
  }
  if (type != 2 || !ReadLength(at, end, value)) return false;
  const uint8_t* stop = at + value;
  while (at < stop) {
    if (!ReadVarint(at, stop, value)) return false;
    values.push_back(int64_t(value));
  }
  return true;
}

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (buffer.Dump(&slices).ok())
    for (const auto& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes;
}

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// What a call to the service calls back with: its status and, if OK, its answer's bytes.
using Answered = std::function<void(const grpc::Status&, const std::string&)>;

// A Search request's rows and what it must share with the requests it is joined with.
struct Part {
  int form = 0;  // the query's field: 3 codes (packed), 2 features
  int64_t bits = 0, k = 0, radius = 0;
  bool has_radius = false;
  std::vector<int64_t> dims;  // features: shape[1:]
  std::string version, rows;  // rows: packed bytes or float32 values
  size_t count = 0;
  std::string key;
};

// Whether `bytes` is a Search request that can be joined with others (codes.packed or features,
// well formed, each field once, no field this front does not know); its Part if so. Anything
// else is sent on as it is, and the service answers it.
bool Joinable(const std::string& bytes, size_t max_rows, Part& part) {
  const uint8_t* at = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* end = at + bytes.size();
  uint32_t seen = 0;
  std::vector<int64_t> shape;
  while (at < end) {
    uint64_t tag, value;
    if (!ReadTag(at, end, tag)) return false;
    int field = int(tag >> 3), type = int(tag & 7);
    if (field < 2 || field > 6 || (seen & (1u << field)) || (field == 3 && (seen & 4)) || (field == 2 && (seen & 8))) return false;
    seen |= 1u << field;
    if (field == 4 || field == 5) {
      if (type != 0 || !ReadVarint(at, end, value)) return false;
      (field == 4 ? part.k : part.radius) = int32_t(uint32_t(value));
      part.has_radius |= field == 5;
      continue;
    }
    if (type != 2 || !ReadLength(at, end, value)) return false;
    const uint8_t* inner = at;
    at += value;
    if (field == 6) {
      part.version.assign(reinterpret_cast<const char*>(inner), value);
      continue;
    }
    part.form = field;
    uint32_t inner_seen = 0;
    while (inner < at) {
      uint64_t inner_tag;
      if (!ReadTag(inner, at, inner_tag)) return false;
      int inner_field = int(inner_tag >> 3), inner_type = int(inner_tag & 7);
      if (inner_field < 1 || inner_field > 2 || (inner_seen & (1u << inner_field))) return false;
      inner_seen |= 1u << inner_field;
      if (field == 3 && inner_field == 1) {
        if (inner_type != 0 || !ReadVarint(inner, at, value)) return false;
        part.bits = int32_t(uint32_t(value));
      } else if (field == 2 && inner_field == 1) {
        if (!ReadInts(inner, at, inner_type, shape)) return false;
      } else {  // packed codes, or packed float values
        if (inner_type != 2 || !ReadLength(inner, at, value)) return false;
        part.rows.assign(reinterpret_cast<const char*>(inner), value);
        inner += value;
      }
    }
  }
  if (part.form == 3) {
    if (part.bits <= 0 || part.bits % 8 || part.rows.empty() || part.rows.size() % (part.bits / 8)) return false;
    part.count = part.rows.size() / (part.bits / 8);
  } else if (part.form == 2) {
    if (shape.size() < 2 || shape[0] < 1) return false;
    size_t width = 1;
    for (size_t i = 1; i < shape.size(); ++i) {
      if (shape[i] < 1 || shape[i] > (1 << 20)) return false;
      width *= size_t(shape[i]);
    }
    if (part.rows.size() != size_t(shape[0]) * width * 4) return false;
    for (size_t at = 0; at < part.rows.size(); at += 4) {  // NaN or infinite: the service refuses the whole request
      uint32_t bits;
      std::memcpy(&bits, part.rows.data() + at, 4);
      if ((bits & 0x7F800000u) == 0x7F800000u) return false;
    }
    part.count = size_t(shape[0]);
    part.dims.assign(shape.begin() + 1, shape.end());
  } else {
    return false;
  }
  if (part.count > max_rows) return false;
  part.key = std::to_string(part.form) + "|" + std::to_string(part.bits) + "|" + std::to_string(part.k) + "|" +
             (part.has_radius ? std::to_string(part.radius) : "-") + "|" + part.version + "|";
  for (int64_t dim : part.dims) part.key += std::to_string(dim) + ",";
  return true;
}

void WriteTag(std::string& out, int field, int type) { WriteVarint(out, uint64_t(field) << 3 | type); }

// The request of `parts` joined: the first's k, radius and version, everyone's rows in order.
std::string JoinedRequest(const std::vector<const Part*>& parts) {
  const Part& first = *parts.front();
  std::string rows, query;
  size_t count = 0;
  for (const Part* part : parts) {
    rows += part->rows;
    count += part->count;
  }
  if (first.form == 3) {
    WriteTag(query, 1, 0);
    WriteVarint(query, uint64_t(first.bits));
  } else {
    std::string shape;
    WriteVarint(shape, count);
    for (int64_t dim : first.dims) WriteVarint(shape, uint64_t(dim));
    WriteBytes(query, 1, shape);
  }
  WriteBytes(query, 2, rows);
  std::string out;
  WriteBytes(out, first.form, query);
  WriteTag(out, 4, 0);
  WriteVarint(out, uint64_t(first.k));
  if (first.has_radius) {
    WriteTag(out, 5, 0);
    WriteVarint(out, uint64_t(first.radius));
  }
  if (!first.version.empty()) WriteBytes(out, 6, first.version);
  return out;
}

// A SearchResponse cut into its fields other than the results (`head`) and each result (field 4,
// tag and length included); false if malformed.
bool SplitResponse(const std::string& bytes, std::string& head, std::vector<std::string>& results) {
  const uint8_t* begin = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* at = begin;
  const uint8_t* end = at + bytes.size();
  while (at < end) {
    const uint8_t* start = at;
    uint64_t tag;
    if (!ReadTag(at, end, tag) || !Skip(at, end, int(tag & 7))) return false;
    std::string field(reinterpret_cast<const char*>(start), at - start);
    if ((tag >> 3) == 4) results.push_back(std::move(field));
    else head += field;
  }
  return true;
}


// Unary calls and health Watch streams to the search service's processes, over `channels`
// connections of this front's own to each, taken in turn (so the processes share the work
// evenly, and a restarted one gets its share as soon as it serves). A connection that failed is
// passed over, and a unary call that a process could not take (UNAVAILABLE: it is restarting or
// stopping) is sent once more, to another process.
class Backend {
 public:
  Backend(const std::vector<std::string>& addresses, int channels) : processes_(addresses.size()) {
    for (int i = 0; i < channels; ++i)
      for (const std::string& address : addresses) {
        grpc::ChannelArguments arguments;
        arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
        arguments.SetMaxReceiveMessageSize(-1);
        // a restarted process is reached within about 0.1-1 s of serving, not after gRPC's default backoff (up to 2 min)
        arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
        arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
        arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
        channels_.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments));
        stubs_.push_back(std::make_unique<grpc::GenericStub>(channels_.back()));
      }
  }

  // Calls `method` with `deadline` (time_point::max(): none); `done` gets the outcome.
  void Call(const std::string& method, const std::string& bytes, Clock::time_point deadline, Answered done) {
    Send(method, Buffer(bytes), deadline, std::move(done), processes_ > 1);
  }

  void Watch(grpc::ClientContext* context, grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* reactor) {
    stubs_[Next()]->PrepareBidiStreamingCall(context, kHealthWatch, grpc::StubOptions(), reactor);
  }

 private:
  void Send(const std::string& method, const grpc::ByteBuffer& request, Clock::time_point deadline, Answered done, bool again) {
    struct Flight {
      grpc::ClientContext context;
      grpc::ByteBuffer request, response;
    };
    auto* flight = new Flight;
    flight->request = request;  // shares the bytes
    flight->context.set_deadline(deadline);
    stubs_[Next()]->UnaryCall(&flight->context, method, grpc::StubOptions(), &flight->request, &flight->response,
                              [this, flight, method, deadline, done, again](grpc::Status status) {
                                if (again && status.error_code() == grpc::StatusCode::UNAVAILABLE) {
                                  Send(method, flight->request, deadline, done, false);
                                  delete flight;
                                  return;
                                }
                                std::string answer = status.ok() ? Bytes(flight->response) : "";
                                delete flight;
                                done(status, answer);
                              });
  }

  // The next connection in turn that has not failed (any, if all have).
  size_t Next() {
    const size_t start = next_++;
    for (size_t i = 0; i < stubs_.size(); ++i) {
      const size_t which = (start + i) % stubs_.size();
      if (channels_[which]->GetState(true) != GRPC_CHANNEL_TRANSIENT_FAILURE) return which;
    }
    return start % stubs_.size();
  }

  const size_t processes_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::atomic<size_t> next_{0};
};

// Limits of joining, from the command line.
struct Limits {
  size_t max_rows, max_waiting, max_bytes;
  int in_flight;
};

// Joins the waiting requests of one key into calls of at most `max_rows` rows, `in_flight` calls
// of a key at a time; each caller gets its rows of the answer.
class Coalescer {
 public:
  Coalescer(Backend& backend, const Limits& limits) : backend_(backend), limits_(limits) {}

  // Queues a joinable request (`cancelled`: set when its caller cancels); false (nothing queued)
  // when `max_waiting` of its kind already wait.
  bool Submit(Part part, std::string original, Clock::time_point deadline, std::shared_ptr<std::atomic<bool>> cancelled,
              Answered reply) {
    std::vector<Waiting> dropped;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const std::string key = part.key;
      Queue& queue = queues_[key];
      if (queue.waiting.size() >= limits_.max_waiting) return false;  // non-empty: never a new, empty key
      ++joinable_;
      queue.waiting.push_back(Waiting{std::move(part), std::move(original), deadline, std::move(cancelled), std::move(reply)});
      Dispatch(key, lock, dropped);
      ForgetIdle(key);  // all dropped at once
    }
    Drop(dropped);
    return true;
  }

  // What it did, for the log at exit.
  std::string Summary() const {
    return std::to_string(joinable_) + " joinable searches, " + std::to_string(joined_) + " of them joined into " +
           std::to_string(joined_calls_) + " calls, " + std::to_string(resent_) + " resent one by one, " + std::to_string(dropped_) +
           " never sent (cancelled or late)";
  }

 private:
  struct Waiting {
    Part part;
    std::string original;
    Clock::time_point deadline;
    std::shared_ptr<std::atomic<bool>> cancelled;
    Answered reply;
    bool alone = false;  // resent after its joined request failed: never joined again
  };
  struct Queue {
    std::deque<Waiting> waiting;
    int in_flight = 0;
  };
  using Batch = std::shared_ptr<std::vector<Waiting>>;

  // Sends what waits under `key` while fewer than `in_flight` of its calls are out (`in_flight` +
  // kResends for requests sent again alone); requests whose caller cancelled or whose deadline
  // passed go to `dropped` instead, to be answered once the lock is released. The queue is looked
  // up again after each send: while the lock was released, a call's end may have erased it.
  void Dispatch(const std::string& key, std::unique_lock<std::mutex>& lock, std::vector<Waiting>& dropped) {
    for (auto found = queues_.find(key); found != queues_.end(); found = queues_.find(key)) {
      Queue& queue = found->second;
      const auto now = Clock::now();
      DropGone(queue, now, dropped);
      if (queue.waiting.empty() || queue.in_flight >= limits_.in_flight + (queue.waiting.front().alone ? kResends : 0)) return;
      auto batch = std::make_shared<std::vector<Waiting>>();
      size_t rows = 0, bytes = 0;
      do {
        rows += queue.waiting.front().part.count;
        bytes += queue.waiting.front().part.rows.size();
        batch->push_back(std::move(queue.waiting.front()));
        queue.waiting.pop_front();
        DropGone(queue, now, dropped);  // one that is gone never splits the requests around it
      } while (!batch->front().alone && !queue.waiting.empty() && !queue.waiting.front().alone &&
               rows + queue.waiting.front().part.count <= limits_.max_rows &&
               bytes + queue.waiting.front().part.rows.size() + 1024 <= limits_.max_bytes);  // 1 kB: the request's other fields
      ++queue.in_flight;
      lock.unlock();
      Send(key, batch);
      lock.lock();
    }
  }

  // Moves the requests first in line whose caller cancelled or whose deadline passed to `dropped`.
  static void DropGone(Queue& queue, Clock::time_point now, std::vector<Waiting>& dropped) {
    while (!queue.waiting.empty() && (*queue.waiting.front().cancelled || queue.waiting.front().deadline <= now)) {
      dropped.push_back(std::move(queue.waiting.front()));
      queue.waiting.pop_front();
    }
  }

  void Send(const std::string& key, Batch batch) {
    if (batch->size() == 1) {  // nothing to join: the request as it came
      Waiting& only = batch->front();
      backend_.Call(kSearch, only.original, only.deadline, [this, key, batch](const grpc::Status& status, const std::string& answer) {
        batch->front().reply(status, answer);
        Done(key, nullptr);
      });
      return;
    }
    ++joined_calls_;
    joined_ += batch->size();
    std::vector<const Part*> parts;
    Clock::time_point deadline = Clock::time_point::min();
    for (const Waiting& waiting : *batch) {
      parts.push_back(&waiting.part);
      deadline = std::max(deadline, waiting.deadline);
    }
    backend_.Call(kSearch, JoinedRequest(parts), deadline, [this, key, batch](const grpc::Status& status, const std::string& answer) {
      std::string head;
      std::vector<std::string> results;
      size_t rows = 0;
      for (const Waiting& waiting : *batch) rows += waiting.part.count;
      if (status.ok() && SplitResponse(answer, head, results) && results.size() == rows) {
        size_t at = 0;
        for (Waiting& waiting : *batch) {
          std::string own = head;
          for (size_t i = 0; i < waiting.part.count; ++i) own += results[at++];
          waiting.reply(grpc::Status::OK, own);
        }
        Done(key, nullptr);
        return;
      }
      resent_ += batch->size();
      Done(key, batch.get());
    });
  }

  // A call of `key` ended; `again`: its requests, to be sent again one by one, first in line. The
  // next waiting ones go, and a key with nothing left is forgotten.
  void Done(const std::string& key, std::vector<Waiting>* again) {
    std::vector<Waiting> dropped;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      Queue& queue = queues_.at(key);  // a key with a call out is never erased
      --queue.in_flight;
      if (again)
        for (auto waiting = again->rbegin(); waiting != again->rend(); ++waiting) {
          waiting->alone = true;
          queue.waiting.push_front(std::move(*waiting));
        }
      Dispatch(key, lock, dropped);
      ForgetIdle(key);
    }
    Drop(dropped);
  }

  // Forgets `key` if nothing of it waits or is in flight (the lock held).
  void ForgetIdle(const std::string& key) {
    auto found = queues_.find(key);
    if (found != queues_.end() && found->second.in_flight == 0 && found->second.waiting.empty()) queues_.erase(found);
  }

  // Ends requests that were never sent with what their callers already see.
  void Drop(std::vector<Waiting>& dropped) {
    dropped_ += dropped.size();
    for (Waiting& waiting : dropped)
      waiting.reply(*waiting.cancelled ? grpc::Status::CANCELLED : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"), "");
  }

  Backend& backend_;
  const Limits limits_;
  std::atomic<uint64_t> joinable_{0}, joined_calls_{0}, joined_{0}, resent_{0}, dropped_{0};
  std::mutex mutex_;
  std::map<std::string, Queue> queues_;
};

// Calls this front holds (counted from their reactor's start to its OnDone), and whether it drains
// (new calls are refused UNAVAILABLE, as the service refuses them while it stops).
std::atomic<int> open_calls{0};
std::atomic<bool> draining{false};

// Whether a HealthCheckRequest names the service's health ("" or the search service), for which
// the front answers NOT_SERVING while it drains, as the service does.
bool OwnHealth(const std::string& bytes) {
  const uint8_t* at = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* end = at + bytes.size();
  std::string service;
  while (at < end) {
    uint64_t tag, value;
    if (!ReadTag(at, end, tag)) return false;
    if (tag == (1 << 3 | 2)) {
      if (!ReadLength(at, end, value)) return false;
      service.assign(reinterpret_cast<const char*>(at), value);
      at += value;
    } else if (!Skip(at, end, int(tag & 7))) {
      return false;
    }
  }
  return service.empty() || service == "tfhash.serving.HashSearch";
}

// A unary call: Search (joined when it can be), GetStatus or health Check, sent on with the
// caller's deadline.
class UnaryProxy : public grpc::ServerGenericBidiReactor {
 public:
  UnaryProxy(Backend& backend, Coalescer& coalescer, size_t max_rows, std::string method, Clock::time_point deadline)
      : backend_(backend), coalescer_(coalescer), max_rows_(max_rows), method_(std::move(method)), deadline_(deadline) {
    ++open_calls;
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
      return;
    }
    std::string bytes = Bytes(in_);
    if (draining && method_ == kHealthCheck && OwnHealth(bytes)) {
      Reply(grpc::Status::OK, std::string(kNotServing, 2));
      return;
    }
    Answered reply = [this](const grpc::Status& status, const std::string& answer) { Reply(status, answer); };
    Part part;
    if (method_ == kSearch && Joinable(bytes, max_rows_, part) && coalescer_.Submit(std::move(part), bytes, deadline_, cancelled_, reply))
      return;
    backend_.Call(method_, bytes, deadline_, std::move(reply));
  }

  void OnCancel() override { *cancelled_ = true; }  // if it still waits to be joined, it is never sent

  void OnDone() override {
    delete this;
    --open_calls;
  }

 private:
  void Reply(const grpc::Status& status, const std::string& answer) {
    if (!status.ok()) {
      Finish(status);
      return;
    }
    out_ = Buffer(answer);
    StartWriteAndFinish(&out_, grpc::WriteOptions(), status);
  }

  Backend& backend_;
  Coalescer& coalescer_;
  const size_t max_rows_;
  const std::string method_;
  const Clock::time_point deadline_;
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  grpc::ByteBuffer in_, out_;
};

// A health Watch stream, relayed message by message from a stream of the service's own. At the
// front's drain (End) it says NOT_SERVING and ends OK, as the service's own stream does when it
// drains. Deleted once the caller's side and the service's side are both done.
class WatchProxy : public grpc::ServerGenericBidiReactor {
 public:
  WatchProxy(Backend& backend, Clock::time_point deadline) : backend_(backend), upstream_(this) {
    ++open_calls;
    context_.set_deadline(deadline);
    Open(this);
    StartRead(&request_);
  }

  // Every open stream, so that the drain can end them.
  static void EndAll() {
    std::vector<WatchProxy*> open;
    {
      std::lock_guard<std::mutex> lock(registry_mutex_);
      draining_ = true;
      for (WatchProxy* proxy : registry_) {
        ++proxy->refs_;
        open.push_back(proxy);
      }
    }
    for (WatchProxy* proxy : open) {
      proxy->End();
      proxy->Release();
    }
  }

  void OnReadDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    read_ = true;
    if (ok && ending_ && !OwnHealth(Bytes(request_))) ending_ = false;  // another name: the service answers it
    if (!ok || ending_) {
      finished_ = true;
      lock.unlock();
      if (ok) FinishNotServing();
      else Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
      return;
    }
    ++refs_;  // the service's side
    lock.unlock();
    backend_.Watch(&context_, &upstream_);
    upstream_.StartWriteLast(&request_, grpc::WriteOptions());
    upstream_.StartRead(&response_);
    upstream_.AddHold();  // reads are started outside the stream's own reactions: it ends only once Unhold says so
    upstream_.StartCall();
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    writing_ = false;
    if (ending_ && !finished_) {
      finished_ = true;
      lock.unlock();
      FinishNotServing();
      Unhold();
      return;
    }
    lock.unlock();
    if (ok) {
      upstream_.StartRead(&response_);
    } else {  // the caller is gone
      context_.TryCancel();
      Unhold();
    }
  }

  void OnCancel() override { context_.TryCancel(); }  // before the call starts, it starts cancelled

  void OnDone() override {
    Close(this);
    Release();
    --open_calls;
  }

 private:
  class Upstream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Upstream(WatchProxy* proxy) : proxy_(proxy) {}
    void OnReadDone(bool ok) override { proxy_->Relay(ok); }
    void OnDone(const grpc::Status& status) override { proxy_->UpstreamDone(status); }

   private:
    WatchProxy* proxy_;
  };

  void Relay(bool ok) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ok || finished_ || ending_) {  // the service's side ended (UpstreamDone follows), or is being cancelled
      lock.unlock();
      Unhold();
      return;
    }
    writing_ = true;
    out_ = response_;
    lock.unlock();
    StartWrite(&out_);
  }

  // After Unhold only, so never while a message is written; while ending, End or OnWriteDone finishes.
  void UpstreamDone(const grpc::Status& status) {
    std::unique_lock<std::mutex> lock(mutex_);
    bool finish = !finished_ && !ending_;
    if (finish) finished_ = true;
    lock.unlock();
    if (finish) Finish(status);
    Release();
  }

  void Unhold() {
    if (!held_.exchange(false)) return;
    upstream_.RemoveHold();
  }

  void End() {
    std::unique_lock<std::mutex> lock(mutex_);
    ending_ = true;
    if (!read_ || finished_) return;  // OnReadDone ends it, or it is over
    bool finish = !writing_;  // else OnWriteDone ends it
    if (finish) finished_ = true;
    lock.unlock();
    if (finish) FinishNotServing();
    context_.TryCancel();
  }

  void FinishNotServing() {
    out_ = Buffer(std::string(kNotServing, 2));
    StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void Release() {
    if (--refs_ == 0) delete this;
  }

  static void Open(WatchProxy* proxy) {
    std::lock_guard<std::mutex> lock(registry_mutex_);
    registry_.insert(proxy);
    if (draining_) proxy->ending_ = true;  // not read yet: OnReadDone ends it
  }

  static void Close(WatchProxy* proxy) {
    std::lock_guard<std::mutex> lock(registry_mutex_);
    registry_.erase(proxy);
  }

  Backend& backend_;
  Upstream upstream_;
  grpc::ClientContext context_;
  grpc::ByteBuffer request_, response_, out_;
  std::mutex mutex_;
  bool read_ = false, writing_ = false, finished_ = false, ending_ = false;
  std::atomic<bool> held_{true};
  std::atomic<int> refs_{1};  // the caller's side
  static std::mutex registry_mutex_;
  static std::set<WatchProxy*> registry_;
  static bool draining_;
};

std::mutex WatchProxy::registry_mutex_;
std::set<WatchProxy*> WatchProxy::registry_;
bool WatchProxy::draining_ = false;

// A call refused at once: a method that is not the search service's or health's, or any call
// while the front drains.
class Refusal : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

class ProxyService : public grpc::CallbackGenericService {
 public:
  ProxyService(Backend& backend, Coalescer& coalescer, size_t max_rows) : backend_(backend), coalescer_(coalescer), max_rows_(max_rows) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    const std::string& method = context->method();
    if (method == kHealthWatch) return new WatchProxy(backend_, context->deadline());  // while draining: NOT_SERVING
    if (draining && method != kHealthCheck)
      return new Refusal(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the search service is stopping"));
    if (method == kSearch || method == kStatus || method == kHealthCheck)
      return new UnaryProxy(backend_, coalescer_, max_rows_, method, context->deadline());
    return new Refusal(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the search service has no method " + method));
  }

 private:
  Backend& backend_;
  Coalescer& coalescer_;
  const size_t max_rows_;
};

std::atomic<bool> stopping{false};

// A whole number from the command line, at least `least`; exits with a usage error otherwise.
long long Number(const char* text, long long least, const char* name) {
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 10);
  if (end == text || *end || value < least) {
    std::fprintf(stderr, "compiled front: %s must be a whole number of at least %lld, got %s\n", name, least, text);
    std::exit(2);
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: %s ADDRESS BACKENDS CHANNELS MAX_ROWS IN_FLIGHT MAX_WAITING MAX_REQUEST_BYTES GRACE_SECONDS PARENT\n",
                 argv[0]);
    return 2;
  }
  std::signal(SIGTERM, [](int) { stopping = true; });
  const long long parent = Number(argv[9], 0, "PARENT");
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (parent && getppid() != pid_t(parent)) return 0;  // the parent is gone already
  const std::string address = argv[1];
  const int channels = int(Number(argv[3], 1, "CHANNELS"));
  const Limits limits{size_t(Number(argv[4], 1, "MAX_ROWS")), size_t(Number(argv[6], 1, "MAX_WAITING")),
                      size_t(Number(argv[7], 1, "MAX_REQUEST_BYTES")), int(Number(argv[5], 1, "IN_FLIGHT"))};
  const long long grace = Number(argv[8], 0, "GRACE_SECONDS");
  std::vector<std::string> backends;
  for (std::string rest = argv[2]; !rest.empty();) {
    const size_t comma = rest.find(',');
    backends.push_back(rest.substr(0, comma));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  Backend backend(backends, channels);
  Coalescer coalescer(backend, limits);
  ProxyService service(backend, coalescer, limits.max_rows);

  int bound = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 1);  // the port its parent holds
  builder.RegisterCallbackGenericService(&service);
  builder.SetMaxReceiveMessageSize(int(std::min<size_t>(limits.max_bytes, INT32_MAX)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::fprintf(stderr, "compiled front: cannot serve on %s\n", address.c_str());
    return 1;
  }
  std::fprintf(stderr, "compiled search front on %s\n", address.c_str());
  std::fflush(stderr);
  while (!stopping) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // The drain, as the service's own: new calls are refused UNAVAILABLE, the health streams end
  // with NOT_SERVING, the calls held finish within the grace period; calls gRPC had queued but not
  // handed over yet get a moment to reach the refusal; then the server stops.
  draining = true;
  WatchProxy::EndAll();
  const auto last = std::chrono::steady_clock::now() + std::chrono::seconds(grace);
  while (open_calls > 0 && std::chrono::steady_clock::now() < last) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Shutdown cancels what is still open, but then waits for the handlers, which a forwarded call
  // holds until the service answers: exit a second later whatever it still waits for.
  std::atomic<bool> down{false};
  std::thread([&server, &down] {
    server->Shutdown(Clock::now());
    down = true;
  }).detach();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!down && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::fprintf(stderr, "compiled front: %s%s\n", coalescer.Summary().c_str(), down ? "" : "; calls still open at exit");
  std::fflush(stderr);
  std::_Exit(0);  // without tearing down: a forwarded call's completion may still be running
}
