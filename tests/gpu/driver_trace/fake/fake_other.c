/* A second library that asks cuGetProcAddress for a pointer of its own. */
#include <stdint.h>
int cuGetProcAddress_v2(const char *, void **, int, uint64_t, int *);
int other_hidden(int x)
{
    int (*f)(int) = 0;
    int st = -1;
    if (cuGetProcAddress_v2("cuHidden", (void **)&f, 13000, 0, &st) || !f) return -1;
    return f(x);
}
