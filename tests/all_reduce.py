# A sum all-reduce over TCP at the rendezvous kiln gives a gang (see tests/e2e/tests/gang.rs,
# tests/topology/tests/replicas.rs): each node sends its rank + 1 to rank 0, which answers the
# sum; then rank 0 counts steps into $KILN_OUTPUTS/step until $STEPS, resuming from the synced
# count, while the others wait for it to close.
import os, socket, time
rank, n = int(os.environ["KILN_NODE_RANK"]), int(os.environ["KILN_NUM_NODES"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
assert os.environ["NODE_RANK"] == str(rank) and os.environ["WORLD_SIZE"] == str(n)
assert os.environ["KILN_MASTER_ADDR"] == addr and os.environ["KILN_MASTER_PORT"] == str(port)
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(n)
    peers = [server.accept()[0] for _ in range(n - 1)]
    total = 1 + sum(int(peer.recv(64)) for peer in peers)
    for peer in peers:
        peer.sendall(str(total).encode())
else:
    for _ in range(600):
        try:
            peer = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    peer.sendall(str(rank + 1).encode())
    total = int(peer.recv(64))
print(f"rank {rank} of {n} sum {total}", flush=True)
if rank == 0:
    out = os.environ["KILN_OUTPUTS"]
    with open(os.path.join(out, "sum"), "w") as f:
        f.write(str(total))
    step = 0
    resume = os.path.join(os.environ.get("KILN_RESUME_FROM", ""), "step")
    if os.environ.get("KILN_RESUME_FROM") and os.path.exists(resume):
        step = int(open(resume).read())
        print(f"attempt {os.environ['KILN_ATTEMPT']} resumes at step {step}", flush=True)
    while step < int(os.environ["STEPS"]):
        step += 1
        with open(os.path.join(out, ".step"), "w") as f:
            f.write(str(step))
        os.rename(os.path.join(out, ".step"), os.path.join(out, "step"))
        time.sleep(0.1)
    for peer in peers:
        peer.close()
else:
    peer.recv(1)
