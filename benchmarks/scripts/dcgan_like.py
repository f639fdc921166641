"""A DCGAN-style loop: a generator and a discriminator, two Adam optimizers, each step
updates D on real and fake images, then G."""

import sys

import torch
from torch import nn

small = "--small" in sys.argv
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
nz, ngf, ndf, batch = (16, 8, 8, 8) if small else (100, 64, 64, 64)

netG = nn.Sequential(
    nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),
    nn.BatchNorm2d(ngf * 4),
    nn.ReLU(True),
    nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
    nn.BatchNorm2d(ngf * 2),
    nn.ReLU(True),
    nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
    nn.BatchNorm2d(ngf),
    nn.ReLU(True),
    nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False),
    nn.Tanh(),
).to(device)
netD = nn.Sequential(
    nn.Conv2d(3, ndf, 4, 2, 1, bias=False),
    nn.LeakyReLU(0.2, inplace=True),
    nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
    nn.BatchNorm2d(ndf * 2),
    nn.LeakyReLU(0.2, inplace=True),
    nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
    nn.BatchNorm2d(ndf * 4),
    nn.LeakyReLU(0.2, inplace=True),
    nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),
    nn.Sigmoid(),
).to(device)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

for _ in range(2 if small else 5):
    real = torch.randn(batch, 3, 32, 32, device=device)
    netD.zero_grad()
    label = torch.full((batch,), 1.0, device=device)
    errD_real = criterion(netD(real).view(-1), label)
    errD_real.backward()
    noise = torch.randn(batch, nz, 1, 1, device=device)
    fake = netG(noise)
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()).view(-1), label)
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    label.fill_(1.0)
    errG = criterion(netD(fake).view(-1), label)
    errG.backward()
    optimizerG.step()
print(f"loss D {(errD_real + errD_fake).item():.4f} G {errG.item():.4f}")
