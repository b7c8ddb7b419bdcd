// CUDA errors: which ones poison the context, how they are thrown, and the test-only poisoning kernel.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

namespace lily::cuda {

bool poisons_context(cudaError_t status) {
  // The runtime documents these as leaving "the process in an inconsistent state": any further
  // CUDA work fails, and only a new process (a new context) recovers.
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  std::string message = "CUDA error: ";
  message += call;
  message += ": ";
  message += cudaGetErrorString(status);
  message += " at ";
  message += file;
  message += ':';
  message += std::to_string(line);
  if (poisons_context(status)) {
    message += " (the device context is lost; the process must restart)";
    throw DeviceFault(message);
  }
  throw std::runtime_error(message);
}

namespace {

// Stores through a null pointer: the same illegal-address fault a kernel bug causes.
__global__ void poison_context_kernel(volatile int* target) { *target = 1; }

}  // namespace

void launch_poison_context(Stream s) {
  launch_serial(poison_context_kernel, 1, 1, 0, s, nullptr);
}

}  // namespace lily::cuda
