// Measurement helpers for the per-shape path choices (fused.py, conv_graph.py).

// Keep the stream busy for about `ns` nanoseconds of the device's global timer. Work queued behind
// it then starts back to back, so CUDA events recorded after it time what the GPU ran, without the
// host's launch gaps (a captured step replays with none). One thread; __nanosleep keeps it idle.
extern "C" __global__ void hold_stream(long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
#if __CUDA_ARCH__ >= 700
        __nanosleep(1000);  // Volta and later; older GPUs spin
#endif
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < (unsigned long long)ns);
}
