/* One header between the kernels and the GPU toolkit: the .cu files are
 * written against CUDA's names, and a HIP build (STRATA_HIP, hipcc) maps
 * each name used here to HIP's. Add a mapping here when a kernel needs a new
 * runtime call, never an #ifdef in a kernel file.
 *
 * Warps: the kernels are written for 32-lane warps (shuffles, masks, block
 * sizes). ST_WARP is that constant; AMD wave64 targets (gfx9xx, CDNA) are
 * refused at start by device_check (device.cu) with a message, not run wrong.
 */
#ifndef STRATA_BACKEND_CUDA_COMPAT_H
#define STRATA_BACKEND_CUDA_COMPAT_H

#define ST_WARP 32
#define ST_FULL_MASK 0xffffffffu

#ifdef STRATA_HIP
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#include <hipblas/hipblas.h>

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaSetDevice hipSetDevice
#define cudaGetDevice hipGetDevice
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaMemGetInfo hipMemGetInfo
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cublasHandle_t hipblasHandle_t
#define cublasStatus_t hipblasStatus_t
#define CUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define cublasCreate hipblasCreate
#define cublasDestroy hipblasDestroy
#define cublasSetStream hipblasSetStream
#define __nv_bfloat16 hip_bfloat16
/* HIP's shuffles take no mask: every lane of the wave takes part. */
#define __shfl_xor_sync(mask, v, lane) __shfl_xor(v, lane)
#define __shfl_sync(mask, v, lane) __shfl(v, lane)
#define __shfl_down_sync(mask, v, lane) __shfl_down(v, lane)
/* The build's targets are "gfxNNNN" names; a device names its own. */
#define ST_GPU_IS_HIP 1
#else
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define ST_GPU_IS_HIP 0
#endif

#endif
