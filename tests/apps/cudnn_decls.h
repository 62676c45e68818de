/* The part of cuDNN 9's API tests/apps/cudnn_conv.cu uses, declared here so that it builds where
 * cuDNN's headers are not installed (CI). Values are cuDNN's (cudnn_graph.h, cudnn_ops.h). */
#ifndef CUDNN_DECLS_H
#define CUDNN_DECLS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
typedef int cudnnStatus_t;
typedef struct cudnnContext *cudnnHandle_t;
typedef void *cudnnBackendDescriptor_t;
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;

size_t cudnnGetVersion(void);
const char *cudnnGetErrorString(cudnnStatus_t status);
cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream);
cudnnStatus_t cudnnBackendCreateDescriptor(int type, cudnnBackendDescriptor_t *desc);
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t desc);
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc, int name, int type,
                                       int64_t count, const void *values);
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t desc, int name, int type,
                                       int64_t requested, int64_t *count, void *values);
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc);
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                                  cudnnBackendDescriptor_t variant_pack);
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *desc);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, int format, int dtype,
                                         int n, int c, int h, int w);
cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derived,
                                            cudnnTensorDescriptor_t x, int mode);
cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t, int mode, int ops, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t z,
    cudnnTensorDescriptor_t y, cudnnTensorDescriptor_t bn, void *activation, size_t *size);
cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t, int mode, int ops, void *activation, cudnnTensorDescriptor_t x, size_t *size);
cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t, int mode, int ops, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y,
    cudnnTensorDescriptor_t dy, cudnnTensorDescriptor_t dz, cudnnTensorDescriptor_t dx,
    cudnnTensorDescriptor_t bn, void *activation, size_t *size);
cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t, int mode, int ops, const void *alpha, const void *beta,
    cudnnTensorDescriptor_t x_desc, const void *x, cudnnTensorDescriptor_t z_desc, const void *z,
    cudnnTensorDescriptor_t y_desc, void *y, cudnnTensorDescriptor_t bn_desc, const void *scale,
    const void *bias, double factor, void *running_mean, void *running_var, double epsilon,
    void *saved_mean, void *saved_inv_var, void *activation, void *workspace,
    size_t workspace_size, void *reserve, size_t reserve_size);
cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t, int mode, int ops, const void *alpha_data, const void *beta_data,
    const void *alpha_param, const void *beta_param, cudnnTensorDescriptor_t x_desc,
    const void *x, cudnnTensorDescriptor_t y_desc, const void *y,
    cudnnTensorDescriptor_t dy_desc, const void *dy, cudnnTensorDescriptor_t dz_desc, void *dz,
    cudnnTensorDescriptor_t dx_desc, void *dx, cudnnTensorDescriptor_t bn_desc,
    const void *scale, const void *bias, void *dscale, void *dbias, double epsilon,
    const void *saved_mean, const void *saved_inv_var, void *activation, void *workspace,
    size_t workspace_size, void *reserve, size_t reserve_size);
cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t, int mode, const void *alpha, const void *beta, cudnnTensorDescriptor_t x_desc,
    const void *x, cudnnTensorDescriptor_t y_desc, void *y, cudnnTensorDescriptor_t bn_desc,
    const void *scale, const void *bias, const void *mean, const void *variance, double epsilon);
}

enum {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_DATA_FLOAT = 0,
    CUDNN_TENSOR_NCHW = 0,
    CUDNN_BATCHNORM_SPATIAL = 1,
    CUDNN_BATCHNORM_OPS_BN = 0,
    CUDNN_CROSS_CORRELATION = 1,
    CUDNN_HEUR_MODE_INSTANT = 0,
    /* cudnnBackendAttributeType_t */
    CUDNN_TYPE_HANDLE = 0, CUDNN_TYPE_DATA_TYPE = 1, CUDNN_TYPE_BOOLEAN = 2, CUDNN_TYPE_INT64 = 3,
    CUDNN_TYPE_FLOAT = 4, CUDNN_TYPE_VOID_PTR = 6, CUDNN_TYPE_CONVOLUTION_MODE = 7,
    CUDNN_TYPE_HEUR_MODE = 8, CUDNN_TYPE_BACKEND_DESCRIPTOR = 15,
    /* cudnnBackendDescriptorType_t */
    CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR = 1, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR = 3,
    CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR = 4, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11,
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12,
    CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR = 16,
    CUDNN_BACKEND_TENSOR_DESCRIPTOR = 17,
    /* cudnnBackendAttributeName_t */
    CUDNN_ATTR_CONVOLUTION_COMP_TYPE = 100, CUDNN_ATTR_CONVOLUTION_CONV_MODE = 101,
    CUDNN_ATTR_CONVOLUTION_DILATIONS = 102, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES = 103,
    CUDNN_ATTR_CONVOLUTION_POST_PADDINGS = 104, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS = 105,
    CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS = 106,
    CUDNN_ATTR_ENGINEHEUR_MODE = 200, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201,
    CUDNN_ATTR_ENGINEHEUR_RESULTS = 202,
    CUDNN_ATTR_EXECUTION_PLAN_HANDLE = 400, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401,
    CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA = 700,
    CUDNN_ATTR_OPERATIONGRAPH_HANDLE = 800, CUDNN_ATTR_OPERATIONGRAPH_OPS = 801,
    CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT = 900, CUDNN_ATTR_TENSOR_DATA_TYPE = 901,
    CUDNN_ATTR_TENSOR_DIMENSIONS = 902, CUDNN_ATTR_TENSOR_STRIDES = 903,
    CUDNN_ATTR_TENSOR_UNIQUE_ID = 906,
    CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1001,
    CUDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003,
};

#endif
