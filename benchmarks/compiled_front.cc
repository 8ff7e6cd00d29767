// A measurement of two design options for the search service's front, not a service: the
// Search RPC of serving/search.proto behind compiled code (gRPC's C++ callback server, one
// process on gRPC's default threads). benchmarks/serving.py runs them as `--fronts compiled` and
// `--fronts compiled-coalescing` and checks their answers against the library's before any load.
//
//   compiled_front serve INDEX_DIR MODEL_VERSION INDEX_KIND PORT
//   compiled_front coalesce BACKEND PORT CHANNELS MAX_ROWS IN_FLIGHT
//
// Both print "compiled search front on 127.0.0.1:PORT" to stderr once they serve, and stop at
// SIGTERM (within about 2 s). Both take requests of up to 64 MB (the service's own limit is
// lower, so it answers for itself). The messages are read and written in protobuf's wire format
// by hand (no protoc here).
//
// `serve` answers by itself: INDEX_DIR holds a flat binary index as tfhash writes it (codes.npy:
// uint8 rows of packed codes; ids.npy: int64 external ids), memory-mapped read-only. It answers
// a SearchRequest whose query is `codes.packed` (1 to 256 rows of the index's width), with
// 1 <= k <= min(1000, the index's size) (the service's default limits) and model_version empty
// or MODEL_VERSION: the exact k nearest by
// Hamming distance, ties in insertion order (the library's flat index, docs/design.md s.10), with
// model_version and index_kind. Malformed bytes and bad values are refused INVALID_ARGUMENT;
// every other form (examples, features, signed codes, radius) and every other method are
// UNIMPLEMENTED. It leaves out what a service needs: encoding, hot swap and the version lock,
// health, REST, a drain on SIGTERM, concurrency limits, metadata (paths, labels).
//
// `coalesce` answers nothing by itself: it joins concurrent Search requests that differ only in
// their rows (packed codes of one width, or features of one shape, with the same k, radius and
// pinned version) into one request of up to MAX_ROWS rows to the search service at BACKEND
// (`tfhash serve search`, over CHANNELS connections of its own), at most IN_FLIGHT such requests
// of one kind at a time, and gives each caller its own rows of the answer, which names one model
// version for the whole batch. A joined request that fails is sent again request by request, so
// each caller gets the status its own request gets. Other forms go through as they are, as do
// GetStatus and the health Check; streaming calls (health Watch) are UNIMPLEMENTED. Everything
// else (checks, versions, hot swap) is the service's.
//
// Build (benchmarks/serving.py does it when needed):
//   g++ -O3 -march=native -std=c++17 compiled_front.cc -o compiled_front $(pkg-config --cflags --libs grpc++)

#include <fcntl.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

const char kSearch[] = "/tfhash.serving.HashSearch/Search";
constexpr size_t kBlock = 1024;  // items whose distances are computed before any is looked at
constexpr int64_t kMaxK = 1000;  // the service's default limits (tfhash.serving.requests.Limits)
constexpr size_t kMaxRows = 256;
constexpr int kMaxMessage = 64 << 20;  // above the service's own limit, which then answers for itself

// A read-only mapping of a .npy file: its data, rows and bytes per row (2-d uint8 or 1-d int64).
struct Npy {
  const uint8_t* data = nullptr;
  size_t rows = 0, width = 0;
};

Npy MapNpy(const std::string& path, const char* descr) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  struct stat info;
  fstat(fd, &info);
  void* map = mmap(nullptr, info.st_size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) throw std::runtime_error("cannot map " + path);
  const uint8_t* bytes = static_cast<const uint8_t*>(map);
  if (info.st_size < 12 || std::memcmp(bytes, "\x93NUMPY", 6) != 0) throw std::runtime_error(path + " is not a .npy file");
  size_t header = bytes[6] == 1 ? 10 + (bytes[8] | bytes[9] << 8)
                                : 12 + (bytes[8] | bytes[9] << 8 | bytes[10] << 16 | size_t(bytes[11]) << 24);
  std::string text(reinterpret_cast<const char*>(bytes) + 10, header - 10);
  if (text.find(std::string("'descr': '") + descr + "'") == std::string::npos || text.find("'fortran_order': False") == std::string::npos)
    throw std::runtime_error(path + ": expected dtype " + descr + " in C order: " + text);
  size_t shape = text.find("'shape': (");
  if (shape == std::string::npos) throw std::runtime_error(path + ": no shape");
  unsigned long long rows = 0, width = 0;
  int got = std::sscanf(text.c_str() + shape + 10, "%llu, %llu", &rows, &width);
  Npy npy{bytes + header, rows, got == 2 ? width : 8};
  if (header + npy.rows * npy.width > size_t(info.st_size)) throw std::runtime_error(path + " is truncated");
  return npy;
}

// The served index: packed codes (`words` 64-bit words a row) and their external ids.
struct Index {
  const uint64_t* codes;
  const int64_t* ids;
  size_t count, words;
  int bits;
  std::string version, kind;
};

// Exact k nearest of one query (`words` words), ties in insertion order: a block's distances are
// computed in one vectorised loop; only items closer than the threshold `limit` are kept, where
// `limit` is the smallest distance at which k candidates are already at or below it (so an item
// at a distance that k earlier items reach can never enter). Candidates arrive in insertion order
// and a counting sort by distance keeps it.
void Nearest(const Index& index, const uint64_t* query, size_t k, std::vector<int64_t>& ids, std::vector<float>& distances) {
  const int top = index.bits;
  std::vector<uint32_t> count(top + 2, 0);
  std::vector<std::pair<uint16_t, uint32_t>> kept;  // (distance, position)
  kept.reserve(2 * k + kBlock);
  int limit = top + 1;  // items at distances below it are kept
  uint16_t block[kBlock];
  const size_t words = index.words;
  for (size_t start = 0; start < index.count; start += kBlock) {
    const size_t size = std::min(kBlock, index.count - start);
    const uint64_t* rows = index.codes + start * words;
    if (words == 1) {
      const uint64_t q = query[0];
      for (size_t i = 0; i < size; ++i) block[i] = uint16_t(__builtin_popcountll(rows[i] ^ q));
    } else {
      for (size_t i = 0; i < size; ++i) {
        int d = 0;
        for (size_t w = 0; w < words; ++w) d += __builtin_popcountll(rows[i * words + w] ^ query[w]);
        block[i] = uint16_t(d);
      }
    }
    int below = 0;
    for (size_t i = 0; i < size; ++i) below += block[i] < limit;
    if (!below) continue;
    for (size_t i = 0; i < size; ++i) {
      if (block[i] >= limit) continue;
      kept.emplace_back(block[i], uint32_t(start + i));
      ++count[block[i]];
      size_t at_or_below = 0;
      for (int d = 0; d < limit; ++d) {
        at_or_below += count[d];
        if (at_or_below >= k) {
          limit = d;
          break;
        }
      }
    }
    if (kept.size() > 2 * k + 64) {  // compact: only candidates at or below the limit can be answers
      std::vector<std::pair<uint16_t, uint32_t>> keep;
      for (const auto& item : kept)
        if (item.first <= limit) keep.push_back(item);
        else --count[item.first];
      kept.swap(keep);
    }
  }
  // counting sort by distance, stable: insertion order within a distance
  std::vector<size_t> first(top + 2, 0);
  for (const auto& item : kept) ++first[item.first + 1];
  for (int d = 1; d <= top + 1; ++d) first[d] += first[d - 1];
  std::vector<std::pair<uint16_t, uint32_t>> sorted(kept.size());
  for (const auto& item : kept) sorted[first[item.first]++] = item;
  for (size_t i = 0; i < std::min(k, sorted.size()); ++i) {
    ids.push_back(index.ids[sorted[i].second]);
    distances.push_back(float(sorted[i].first));
  }
}

// Protobuf wire format, the parts the two messages use.
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

struct Request {
  bool has_codes = false, other_form = false, radius = false;
  int64_t bits = 0, k = 0;
  std::string packed, version;
};

// Reads a SearchRequest; an error's message, or "" if the bytes are a well-formed message.
std::string Parse(const std::string& bytes, Request& request) {
  const uint8_t* at = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* end = at + bytes.size();
  while (at < end) {
    uint64_t tag, value;
    if (!ReadTag(at, end, tag)) return "malformed request";
    int field = int(tag >> 3), type = int(tag & 7);
    if ((field == 3 || field == 6 || field == 1 || field == 2) && type == 2) {
      if (!ReadLength(at, end, value)) return "malformed request";
      const uint8_t* inner = at;
      at += value;
      if (field == 6) request.version.assign(reinterpret_cast<const char*>(inner), value);
      else if (field != 3) request.other_form = true;
      else {  // Codes: bits = 1, packed = 2, signs = 3
        request.has_codes = true;
        while (inner < at) {
          uint64_t inner_tag, inner_value;
          if (!ReadTag(inner, at, inner_tag)) return "malformed codes";
          int inner_field = int(inner_tag >> 3), inner_type = int(inner_tag & 7);
          if (inner_field == 1 && inner_type == 0) {
            if (!ReadVarint(inner, at, inner_value)) return "malformed codes";
            request.bits = int32_t(uint32_t(inner_value));
          } else if (inner_field == 2 && inner_type == 2) {
            if (!ReadLength(inner, at, inner_value)) return "malformed codes";
            request.packed.assign(reinterpret_cast<const char*>(inner), inner_value);
            inner += inner_value;
          } else if (inner_field == 3) {
            request.other_form = true;
            if (!Skip(inner, at, inner_type)) return "malformed codes";
          } else if (!Skip(inner, at, inner_type)) {
            return "malformed codes";
          }
        }
      }
    } else if (field == 4 && type == 0) {
      if (!ReadVarint(at, end, value)) return "malformed request";
      request.k = int32_t(uint32_t(value));
    } else if (field == 5) {
      request.radius = true;
      if (!Skip(at, end, type)) return "malformed request";
    } else if (!Skip(at, end, type)) {
      return "malformed request";
    }
  }
  return "";
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

// A unary call on the generic callback API: `Handle` gets the request's bytes and calls `Reply`
// once; a method the subclass does not take is finished UNIMPLEMENTED with `refusal`.
class UnaryReactor : public grpc::ServerGenericBidiReactor {
 public:
  void Start(const std::string& refusal) {
    if (refusal.empty()) StartRead(&in_);
    else Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, refusal));
  }

  void OnReadDone(bool ok) override {
    if (ok) Handle(Bytes(in_));
    else Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
  }

  void Reply(const grpc::Status& status, const std::string& answer) {
    if (!status.ok()) {
      Finish(status);
      return;
    }
    out_ = Buffer(answer);
    StartWriteAndFinish(&out_, grpc::WriteOptions(), status);
  }

  void OnDone() override { delete this; }

 protected:
  virtual void Handle(std::string bytes) = 0;

 private:
  grpc::ByteBuffer in_, out_;
};

class SearchReactor : public UnaryReactor {
 public:
  SearchReactor(const Index& index, bool search) : index_(index) { Start(search ? "" : "the compiled front answers Search only"); }

 private:
  void Handle(std::string bytes) override {
    std::string answer;
    grpc::Status status = Answer(bytes, answer);
    Reply(status, answer);
  }

  grpc::Status Answer(const std::string& bytes, std::string& out) {
    Request request;
    std::string error = Parse(bytes, request);
    if (!error.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, error);
    if (request.other_form || request.radius || !request.has_codes)
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the compiled front answers packed codes and k only");
    const size_t width = index_.words * 8;
    if (request.bits != index_.bits)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "codes.bits is " + std::to_string(request.bits) +
                          "; the index holds " + std::to_string(index_.bits) + "-bit codes");
    if (request.packed.empty() || request.packed.size() % width || request.packed.size() / width > kMaxRows)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "codes.packed must hold 1 to " + std::to_string(kMaxRows) +
                          " rows of " + std::to_string(width) + " bytes; got " + std::to_string(request.packed.size()) + " bytes");
    if (request.k < 1 || request.k > int64_t(index_.count) || request.k > kMaxK)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "k must be in [1, " + std::to_string(std::min<int64_t>(index_.count, kMaxK)) +
                          "]; got " + std::to_string(request.k));
    if (!request.version.empty() && request.version != index_.version)
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "model version " + request.version + " is not served");
    WriteBytes(out, 1, index_.version);
    WriteBytes(out, 2, index_.kind);
    WriteVarint(out, 3 << 3 | 0);
    WriteVarint(out, 1);
    std::vector<uint64_t> query(index_.words);
    for (size_t row = 0; row < request.packed.size() / width; ++row) {
      std::memcpy(query.data(), request.packed.data() + row * width, width);
      std::vector<int64_t> ids;
      std::vector<float> distances;
      Nearest(index_, query.data(), size_t(request.k), ids, distances);
      std::string packed_ids, packed_distances, neighbors;
      for (int64_t id : ids) WriteVarint(packed_ids, uint64_t(id));
      packed_distances.assign(reinterpret_cast<const char*>(distances.data()), distances.size() * sizeof(float));
      WriteBytes(neighbors, 1, packed_ids);
      WriteBytes(neighbors, 2, packed_distances);
      WriteBytes(out, 4, neighbors);
    }
    return grpc::Status::OK;
  }

  const Index& index_;
};

class SearchService : public grpc::CallbackGenericService {
 public:
  explicit SearchService(const Index& index) : index_(index) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    return new SearchReactor(index_, context->method() == kSearch);
  }

 private:
  const Index& index_;
};

// ---- coalesce ----

const char kStatus[] = "/tfhash.serving.HashSearch/GetStatus";
const char kHealthCheck[] = "/grpc.health.v1.Health/Check";

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

// Unary calls to the search service over connections of this front's own, taken in turn.
class Backend {
 public:
  Backend(const std::string& address, int channels) {
    for (int i = 0; i < channels; ++i) {
      grpc::ChannelArguments arguments;
      arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      arguments.SetMaxReceiveMessageSize(-1);
      stubs_.push_back(std::make_unique<grpc::GenericStub>(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments)));
    }
  }

  void Call(const std::string& method, const std::string& bytes, Answered done) {
    struct Flight {
      grpc::ClientContext context;
      grpc::ByteBuffer request, response;
    };
    auto* flight = new Flight;
    flight->request = Buffer(bytes);
    flight->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stubs_[next_++ % stubs_.size()]->UnaryCall(&flight->context, method, grpc::StubOptions(), &flight->request, &flight->response,
                                               [flight, done](grpc::Status status) {
                                                 std::string answer = status.ok() ? Bytes(flight->response) : "";
                                                 delete flight;
                                                 done(status, answer);
                                               });
  }

 private:
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::atomic<size_t> next_{0};
};

// Joins the waiting requests of one key into calls of at most `max_rows` rows, `in_flight` calls
// of a key at a time; each caller gets its rows of the answer.
class Coalescer {
 public:
  Coalescer(Backend& backend, size_t max_rows, int in_flight) : backend_(backend), max_rows_(max_rows), in_flight_(in_flight) {}

  void Submit(Part part, std::string original, Answered reply) {
    ++joinable_;
    std::unique_lock<std::mutex> lock(mutex_);
    const std::string key = part.key;
    queues_[key].waiting.push_back(Waiting{std::move(part), std::move(original), std::move(reply)});
    Dispatch(key, lock);
  }

  // What it did, for the log at exit.
  std::string Summary() const {
    return std::to_string(joinable_) + " joinable searches, " + std::to_string(joined_) + " of them joined into " +
           std::to_string(joined_calls_) + " calls, " + std::to_string(resent_) + " resent one by one";
  }

 private:
  struct Waiting {
    Part part;
    std::string original;
    Answered reply;
  };
  struct Queue {
    std::deque<Waiting> waiting;
    int in_flight = 0;
  };

  // Sends what waits under `key` while fewer than `in_flight_` of its calls are out. The queue is
  // looked up again after each send: while the lock was released, a call's end may have erased it.
  void Dispatch(const std::string& key, std::unique_lock<std::mutex>& lock) {
    for (auto found = queues_.find(key); found != queues_.end(); found = queues_.find(key)) {
      Queue& queue = found->second;
      if (queue.in_flight >= in_flight_ || queue.waiting.empty()) return;
      auto batch = std::make_shared<std::vector<Waiting>>();
      size_t rows = 0;
      while (!queue.waiting.empty() && (batch->empty() || rows + queue.waiting.front().part.count <= max_rows_)) {
        rows += queue.waiting.front().part.count;
        batch->push_back(std::move(queue.waiting.front()));
        queue.waiting.pop_front();
      }
      ++queue.in_flight;
      lock.unlock();
      Send(key, batch);
      lock.lock();
    }
  }

  void Send(const std::string& key, std::shared_ptr<std::vector<Waiting>> batch) {
    if (batch->size() == 1) {  // nothing to join: the request as it came
      Waiting& only = batch->front();
      backend_.Call(kSearch, only.original, [this, key, batch](const grpc::Status& status, const std::string& answer) {
        batch->front().reply(status, answer);
        Done(key);
      });
      return;
    }
    ++joined_calls_;
    joined_ += batch->size();
    std::vector<const Part*> parts;
    for (const Waiting& waiting : *batch) parts.push_back(&waiting.part);
    backend_.Call(kSearch, JoinedRequest(parts), [this, key, batch](const grpc::Status& status, const std::string& answer) {
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
        Done(key);
        return;
      }
      // each request on its own, so that each gets its own status; each counts as in flight
      resent_ += batch->size();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queues_.at(key).in_flight += int(batch->size()) - 1;  // the joined call's place goes to the first
      }
      for (Waiting& waiting : *batch) {
        Answered reply = waiting.reply;
        backend_.Call(kSearch, waiting.original, [this, key, reply](const grpc::Status& status, const std::string& answer) {
          reply(status, answer);
          Done(key);
        });
      }
    });
  }

  // A call of `key` ended: the next waiting ones go, and a key with nothing left is forgotten.
  void Done(const std::string& key) {
    std::unique_lock<std::mutex> lock(mutex_);
    --queues_.at(key).in_flight;  // a key with a call out is never erased
    Dispatch(key, lock);
    auto found = queues_.find(key);
    if (found != queues_.end() && found->second.in_flight == 0 && found->second.waiting.empty()) queues_.erase(found);
  }

  Backend& backend_;
  const size_t max_rows_;
  const int in_flight_;
  std::atomic<uint64_t> joinable_{0}, joined_calls_{0}, joined_{0}, resent_{0};
  std::mutex mutex_;
  std::map<std::string, Queue> queues_;
};

class ProxyReactor : public UnaryReactor {
 public:
  ProxyReactor(Backend& backend, Coalescer& coalescer, size_t max_rows, std::string method)
      : backend_(backend), coalescer_(coalescer), max_rows_(max_rows), method_(std::move(method)) {
    Start(method_ == kSearch || method_ == kStatus || method_ == kHealthCheck
              ? "" : "the coalescing front passes on unary Search, GetStatus and health Check only");
  }

 private:
  void Handle(std::string bytes) override {
    Answered reply = [this](const grpc::Status& status, const std::string& answer) { UnaryReactor::Reply(status, answer); };
    Part part;
    if (method_ == kSearch && Joinable(bytes, max_rows_, part)) coalescer_.Submit(std::move(part), std::move(bytes), std::move(reply));
    else backend_.Call(method_, bytes, std::move(reply));
  }

  Backend& backend_;
  Coalescer& coalescer_;
  const size_t max_rows_;
  const std::string method_;
};

class ProxyService : public grpc::CallbackGenericService {
 public:
  ProxyService(Backend& backend, Coalescer& coalescer, size_t max_rows) : backend_(backend), coalescer_(coalescer), max_rows_(max_rows) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    return new ProxyReactor(backend_, coalescer_, max_rows_, context->method());
  }

 private:
  Backend& backend_;
  Coalescer& coalescer_;
  const size_t max_rows_;
};

std::atomic<bool> stopping{false};

}  // namespace

// Serves `service` on 127.0.0.1:`port` until SIGTERM, then prints `summary()` and exits.
[[noreturn]] void Serve(grpc::CallbackGenericService& service, const std::string& port, const std::string& what,
          const std::function<std::string()>& summary = nullptr) {
  int bound = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:" + port, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterCallbackGenericService(&service);
  builder.SetMaxReceiveMessageSize(kMaxMessage);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::fprintf(stderr, "compiled front: cannot serve on port %s\n", port.c_str());
    std::exit(1);
  }
  std::signal(SIGTERM, [](int) { stopping = true; });
  std::fprintf(stderr, "compiled search front on 127.0.0.1:%d (%s)\n", bound, what.c_str());
  std::fflush(stderr);
  while (!stopping) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Shutdown cancels the calls still open after 1 s but then waits for their handlers, which a
  // forwarded call holds until the service answers: exit after 2 s whatever it waits for.
  std::atomic<bool> down{false};
  std::thread([&server, &down] {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    down = true;
  }).detach();
  for (int i = 0; i < 20 && !down; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (summary) std::fprintf(stderr, "compiled front: %s\n", summary().c_str());
  std::fflush(stderr);
  std::_Exit(0);  // without tearing down: a forwarded call's completion may still be running, and Shutdown
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "coalesce" && argc == 7) {
    const int channels = std::atoi(argv[4]), max_rows = std::atoi(argv[5]), in_flight = std::atoi(argv[6]);
    if (channels < 1 || max_rows < 1 || in_flight < 1) {
      std::fprintf(stderr, "compiled front: CHANNELS, MAX_ROWS and IN_FLIGHT must be at least 1\n");
      return 2;
    }
    Backend backend(argv[2], channels);
    Coalescer coalescer(backend, size_t(max_rows), in_flight);
    ProxyService service(backend, coalescer, max_rows);
    Serve(service, argv[3], std::string("joining for ") + argv[2], [&coalescer] { return coalescer.Summary(); });
  }
  if (mode != "serve" || argc != 6) {
    std::fprintf(stderr, "usage: %s serve INDEX_DIR MODEL_VERSION INDEX_KIND PORT\n"
                         "       %s coalesce BACKEND PORT CHANNELS MAX_ROWS IN_FLIGHT\n", argv[0], argv[0]);
    return 2;
  }
  const std::string directory = argv[2];
  Index index;
  try {
    Npy codes = MapNpy(directory + "/codes.npy", "|u1");
    Npy ids = MapNpy(directory + "/ids.npy", "<i8");
    if (codes.width % 8 || codes.width == 0 || ids.rows != codes.rows || reinterpret_cast<uintptr_t>(codes.data) % 8)
      throw std::runtime_error("codes.npy must hold rows of a multiple of 8 bytes, 8-byte aligned, one per id");
    index = Index{reinterpret_cast<const uint64_t*>(codes.data), reinterpret_cast<const int64_t*>(ids.data), codes.rows,
                  codes.width / 8, int(codes.width * 8), argv[3], argv[4]};
  } catch (const std::exception& err) {
    std::fprintf(stderr, "compiled front: %s\n", err.what());
    return 1;
  }
  SearchService service(index);
  Serve(service, argv[5], std::to_string(index.count) + " codes of " + std::to_string(index.bits) + " bits");
}
