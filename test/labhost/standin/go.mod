module qemu-ssh-provisioner/test/labhost/standin

go 1.19

require gopkg.in/yaml.v3 v3.0.1
