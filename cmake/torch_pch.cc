// Anchor translation unit for the shared precompiled torch header (see CMakeLists.txt).
#include <torch/torch.h>
