// A compiled gRPC load generator for benchmarks/serving.py (--load-generators cpp): the same
// closed-loop clients as its Python one, on gRPC's C++ client, so that the clients take little
// of the cores the service shares with them. Requests are opaque bytes (a generic stub), so this
// file knows nothing of tfhash's messages; the benchmark checks the answers it writes back.
//
//   loadgen ADDRESS METHOD CLIENTS REQUESTS OUTPUT
//
// REQUESTS holds the serialized requests, each as a 4-byte little-endian length and its bytes.
// Each client has a channel (and a connection) of its own and one call in flight; one thread
// drives them all through one completion queue. Each makes 5 warm-up calls; then one
// "answer HEX" line per client (its last warm-up answer) and "ready" are printed. Stdin then
// gives "START STOP" (Unix seconds): every client sends requests back to back from START until
// STOP, and the latency of each one answered by STOP is kept. OUTPUT then gets "errors N" and one
// latency in ms per line. Any failure before the span exits with status 1 and a message.
//
// Build (benchmarks/serving.py does it when needed):
//   g++ -O2 -std=c++17 loadgen.cc -o loadgen $(pkg-config --cflags --libs grpc++)

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using Wall = std::chrono::system_clock;

// One closed-loop client: its own channel, at most one call in flight.
struct Client {
  std::unique_ptr<grpc::GenericStub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call;
  grpc::ByteBuffer answer;
  grpc::Status status;
  Clock::time_point begin;
  size_t next = 0;  // the next request's number
  int warm_ups = 0;
  std::string warm_answer;
};

// Sends `client`'s next request; its completion comes back on `queue` tagged with the client.
void Send(Client& client, grpc::CompletionQueue& queue, const std::string& method,
          const std::vector<grpc::ByteBuffer>& requests) {
  client.call.reset();  // the last call's reader lives in its context's arena: release it first
  client.context = std::make_unique<grpc::ClientContext>();
  client.context->set_deadline(Wall::now() + std::chrono::seconds(30));
  client.call = client.stub->PrepareUnaryCall(client.context.get(), method,
                                              requests[client.next++ % requests.size()], &queue);
  client.call->StartCall();
  client.begin = Clock::now();
  client.call->Finish(&client.answer, &client.status, &client);
}

std::vector<grpc::ByteBuffer> ReadRequests(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<grpc::ByteBuffer> requests;
  uint8_t head[4];
  while (in.read(reinterpret_cast<char*>(head), 4)) {
    uint32_t size = head[0] | (head[1] << 8) | (head[2] << 16) | (uint32_t(head[3]) << 24);
    std::string bytes(size, '\0');
    if (!in.read(bytes.data(), size)) break;
    grpc::Slice slice(bytes);
    requests.emplace_back(&slice, 1);
  }
  return requests;
}

std::string Hex(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string hex;
  if (!buffer.Dump(&slices).ok()) return hex;
  char digits[3];
  for (const auto& slice : slices)
    for (size_t i = 0; i < slice.size(); ++i) {
      std::snprintf(digits, sizeof digits, "%02x", slice.begin()[i]);
      hex += digits;
    }
  return hex;
}

// The client whose call completed next; a failed queue ends the program.
Client& Next(grpc::CompletionQueue& queue) {
  void* tag = nullptr;
  bool ok = false;
  if (!queue.Next(&tag, &ok) || !ok) {
    std::cerr << "loadgen: the completion queue failed\n";
    std::_Exit(1);
  }
  return *static_cast<Client*>(tag);
}

Wall::time_point ToWall(double seconds) {
  return Wall::time_point(std::chrono::duration_cast<Wall::duration>(std::chrono::duration<double>(seconds)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: loadgen ADDRESS METHOD CLIENTS REQUESTS OUTPUT\n";
    return 2;
  }
  const std::string address = argv[1], method = argv[2], output = argv[5];
  const int count = std::atoi(argv[3]);
  const auto requests = ReadRequests(argv[4]);
  if (count < 1 || requests.empty()) {
    std::cerr << "loadgen: need at least one client and one request (clients " << argv[3] << ", requests read "
              << requests.size() << " from " << argv[4] << ")\n";
    return 2;
  }
  // One thread drives every client through one completion queue: no thread switch per call.
  grpc::CompletionQueue queue;
  std::vector<Client> clients(count);
  for (int slot = 0; slot < count; ++slot) {
    grpc::ChannelArguments arguments;
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    clients[slot].stub = std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments));
    clients[slot].next = size_t(slot);
    Send(clients[slot], queue, method, requests);
  }
  for (int warm = 0; warm < count;) {  // warm-up: the connections and 5 answered calls each
    Client& client = Next(queue);
    if (!client.status.ok()) {
      std::cerr << "loadgen: " << address << ": a warm-up call failed: " << client.status.error_message() << "\n";
      std::_Exit(1);
    }
    if (++client.warm_ups < 5) {
      Send(client, queue, method, requests);
    } else {
      client.warm_answer = Hex(client.answer);
      ++warm;
    }
  }
  for (const auto& client : clients) std::cout << "answer " << client.warm_answer << "\n";
  std::cout << "ready" << std::endl;
  double start = 0, stop = 0;
  if (!(std::cin >> start >> stop)) {
    std::cerr << "loadgen: expected 'START STOP' on stdin\n";
    std::_Exit(1);
  }
  const auto end = ToWall(stop);
  std::this_thread::sleep_until(ToWall(start));
  for (int slot = 0; slot < count; ++slot) clients[slot].next = size_t(slot) * 7919;
  for (auto& client : clients) Send(client, queue, method, requests);
  std::vector<double> latencies_ms;
  int64_t errors = 0;
  for (int active = count; active > 0;) {
    Client& client = Next(queue);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - client.begin).count();
    const auto now = Wall::now();
    if (!client.status.ok()) {
      ++errors;
    } else if (now <= end) {
      latencies_ms.push_back(ms);
    }
    if (now < end) {
      Send(client, queue, method, requests);
    } else {
      --active;
    }
  }
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
  std::ofstream out(output);
  out << "errors " << errors << "\n";
  for (double ms : latencies_ms) out << ms << "\n";
  out.close();  // flushed: a failed write shows here
  return out ? 0 : 1;
}
