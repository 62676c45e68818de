// devices: which devices the program sees (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER): the count
// and its error, each device's UUID and PCI bus id (from its properties, and as cudaDeviceGetPCIBusId
// writes it and cudaDeviceGetByPCIBusId reads it), that each one takes memory and a copy, and
// the error for the first ordinal past the last.
#include <cuda_runtime.h>

#include <cstdio>

static void print_uuid(const cudaUUID_t &u)
{
    const unsigned char *b = reinterpret_cast<const unsigned char *>(u.bytes);
    printf("GPU-");
    for (int i = 0; i < 16; i++)
        printf("%02x%s", b[i], (i == 3 || i == 5 || i == 7 || i == 9) ? "-" : "");
}

int main()
{
    int count = -1;
    cudaError_t err = cudaGetDeviceCount(&count);
    printf("count: %s %d\n", cudaGetErrorName(err), count);
    for (int d = 0; d < count; d++) {
        cudaDeviceProp prop;
        err = cudaGetDeviceProperties(&prop, d);
        if (err != cudaSuccess) {
            printf("device %d: properties %s\n", d, cudaGetErrorName(err));
            continue;
        }
        printf("device %d: ", d);
        print_uuid(prop.uuid);
        printf(" pci %04x:%02x:%02x\n", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    }
    for (int d = 0; d < count; d++) {  // the bus id string, and back to the ordinal
        char id[32] = "";
        int back = -1;
        cudaError_t get = cudaDeviceGetPCIBusId(id, sizeof id, d);
        cudaError_t by = cudaDeviceGetByPCIBusId(&back, id);
        printf("device %d: bus id %s %s, by bus id %s %d\n", d, cudaGetErrorName(get), id,
               cudaGetErrorName(by), back);
    }
    for (int d = 0; d < count; d++) {
        int *p = nullptr, back = 0, value = 1000 + d;
        cudaError_t set = cudaSetDevice(d);
        cudaError_t alloc = cudaMalloc(&p, 1 << 20);
        cudaError_t copy = cudaMemcpy(p, &value, sizeof value, cudaMemcpyHostToDevice);
        if (copy == cudaSuccess)
            copy = cudaMemcpy(&back, p, sizeof back, cudaMemcpyDeviceToHost);
        printf("device %d: set %s, malloc %s, copy %s %s\n", d, cudaGetErrorName(set),
               cudaGetErrorName(alloc), cudaGetErrorName(copy), back == value ? "yes" : "no");
        cudaFree(p);
    }
    if (count > 0) {
        cudaDeviceProp prop;
        int value = 0;
        printf("set device %d: %s\n", count, cudaGetErrorName(cudaSetDevice(count)));
        printf("properties of device %d: %s\n", count,
               cudaGetErrorName(cudaGetDeviceProperties(&prop, count)));
        printf("attribute of device %d: %s\n", count,
               cudaGetErrorName(cudaDeviceGetAttribute(&value, cudaDevAttrPciBusId, count)));
        int current = -1;
        cudaGetDevice(&current);
        printf("current device: %d\n", current);
    } else {
        void *p = nullptr;
        printf("malloc: %s\n", cudaGetErrorName(cudaMalloc(&p, 16)));
    }
    return 0;
}
